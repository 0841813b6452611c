"""`grpo export`: a full and a LoRA checkpoint become Hugging Face directories that plain
`transformers` reloads with the checkpoint's logits; casts, run directories and bad input."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_cli.commands import export
from grpo_cli.commands.export import VERIFY_PROMPTS, run_export
from grpo_cli.config.schema import ExportConfig
from grpo_cli.errors import GrpoError
from grpo_cli.models import load_weights
from tests.conftest import REPO, run_grpo
from tests.test_checkpoint import files_at_most
from tests.training.test_trainer import run, small_config


@pytest.fixture(scope="module")
def full_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two steps of full fine-tuning, a checkpoint after each."""
    run_dir = tmp_path_factory.mktemp("full")
    run(small_config(steps=2, save_every=1), run_dir)
    return run_dir


def train_lora(run_dir: Path, target_modules: list[str] | None = None) -> Path:
    cfg = small_config(steps=2, save_every=2)
    cfg.model.lora.enabled = True
    cfg.model.lora.target_modules = target_modules or cfg.model.lora.target_modules
    cfg.optim.lr = 2e-2  # the adapters must move for the merge to be tested
    run(cfg, run_dir)
    return run_dir


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Adapters on the attention projections (the default targets)."""
    return train_lora(tmp_path_factory.mktemp("lora"))


@pytest.fixture(scope="module")
def lora_head_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An adapter on lm_head too, which the tiny model ties to its input embeddings."""
    return train_lora(tmp_path_factory.mktemp("lora_head"), ["q_proj", "v_proj", "lm_head"])


@torch.no_grad()
def logits_of(model: torch.nn.Module, tokenizer_dir: Path) -> list[torch.Tensor]:
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    return [model(**tokenizer(p, return_tensors="pt")).logits[0].float() for p in VERIFY_PROMPTS]


def max_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b))


def checkpoint_logits(checkpoint: Path, base: Path) -> list[torch.Tensor]:
    model = load_weights(checkpoint, base, torch.float32).eval()
    return logits_of(model, checkpoint)


def reloaded_logits(output: Path, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    """Plain transformers, as a user of the exported directory loads it."""
    return logits_of(AutoModelForCausalLM.from_pretrained(output, dtype=dtype).eval(), output)


def tensor_dtypes(path: Path) -> set[torch.dtype]:
    with safe_open(path, "pt") as weights:
        return {weights.get_tensor(key).dtype for key in weights.keys()}


def test_a_full_run_exports_its_newest_checkpoint(full_run: Path, tmp_path: Path) -> None:
    output = tmp_path / "model"
    difference = run_export(ExportConfig(checkpoint=str(full_run), output=str(output)))
    print(f"full fp32 export: max |logit difference| {difference}")
    assert difference == 0.0  # no merge, no cast: the same weights
    files = {p.name for p in output.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "README.md"} <= files
    newest, older = full_run / "checkpoints" / "step_000002", full_run / "checkpoints" / "step_000001"
    exported = reloaded_logits(output)
    assert max_difference(exported, checkpoint_logits(newest, newest)) == 0.0
    assert max_difference(exported, checkpoint_logits(older, older)) > 0  # the run dir resolved to step 2
    card = (output / "README.md").read_text()
    assert f"from `{newest}` (step 2): full weights, dtype fp32" in card
    assert "| reward/mean |" in card  # the metrics line of step 2 (this run wrote no summary.json)
    assert "num_generations: 4" in card  # the training config, from trainer_state.json
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dir left


@pytest.mark.parametrize("targets", ["attention", "tied_lm_head"])
def test_a_lora_run_is_merged_into_its_base(targets: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    lora_run = request.getfixturevalue("lora_run" if targets == "attention" else "lora_head_run")
    checkpoint = lora_run / "checkpoints" / "step_000002"
    output = tmp_path / "merged"
    difference = run_export(ExportConfig(checkpoint=str(checkpoint), output=str(output)))
    print(f"LoRA ({targets}) merged fp32 export: max |logit difference| {difference}")
    assert difference < 1e-5  # the merge only reorders sums
    tied = json.loads((output / "config.json").read_text())["tie_word_embeddings"]
    assert tied is (targets == "attention")  # merged into a shared matrix, the lm_head adapter would move the inputs
    with safe_open(output / "model.safetensors", "pt") as weights:
        assert not [key for key in weights.keys() if "lora" in key]  # a plain model
    assert not (output / "adapter_config.json").exists()
    source = checkpoint_logits(checkpoint, lora_run / "tiny_model")
    assert max_difference(reloaded_logits(output), source) < 1e-5
    base = logits_of(AutoModelForCausalLM.from_pretrained(lora_run / "tiny_model").eval(), checkpoint)
    assert max_difference(base, source) > 1e-3  # the adapter changed the model: the merge is tested
    card = (output / "README.md").read_text()
    assert "LoRA adapter (r=16, alpha=32.0) merged into its base" in card
    assert ("untied from the input embeddings" in card) is (targets == "tied_lm_head")


def test_merge_lora_false_writes_the_adapter_and_names_its_base(lora_run: Path, tmp_path: Path) -> None:
    output = tmp_path / "adapter"
    difference = run_export(ExportConfig(checkpoint=str(lora_run), output=str(output), merge_lora=False))
    assert difference == 0.0
    assert {"adapter_model.safetensors", "adapter_config.json", "generation_config.json"} <= {
        p.name for p in output.iterdir()
    }
    config = json.loads((output / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str((lora_run / "tiny_model").resolve())
    source = checkpoint_logits(lora_run / "checkpoints" / "step_000002", lora_run / "tiny_model")
    assert max_difference(reloaded_logits(output), source) == 0.0  # transformers finds the base itself


def test_dtype_bf16_casts_the_weights(full_run: Path, tmp_path: Path) -> None:
    output = tmp_path / "bf16"
    difference = run_export(ExportConfig(checkpoint=str(full_run), output=str(output), dtype="bf16"))
    print(f"full bf16 export: max |logit difference| {difference}")
    assert 0 < difference < 5e-2  # rounded, within the bf16 tolerance
    assert tensor_dtypes(output / "model.safetensors") == {torch.bfloat16}
    assert json.loads((output / "config.json").read_text())["dtype"] == "bfloat16"
    source = checkpoint_logits(full_run / "checkpoints" / "step_000002", full_run)
    assert max_difference(reloaded_logits(output, torch.bfloat16), source) == pytest.approx(difference)


def test_a_failed_verification_writes_nothing(full_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(export.TOLERANCE, torch.bfloat16, 0.0)  # any rounding now fails the check
    output = tmp_path / "out"
    with pytest.raises(GrpoError, match=r"failed verification: max \|logit difference\| .* > 0 \(bf16\)"):
        run_export(ExportConfig(checkpoint=str(full_run), output=str(output), dtype="bf16"))
    assert list(tmp_path.iterdir()) == []  # neither the output nor a temp dir


def test_bad_checkpoints_and_outputs_are_clear_errors(full_run: Path, tmp_path: Path) -> None:
    def refused(checkpoint: str, output: str) -> str:
        with pytest.raises(GrpoError) as info:
            run_export(ExportConfig(checkpoint=checkpoint, output=output))
        return str(info.value)

    out = str(tmp_path / "out")
    assert refused(str(tmp_path / "missing"), out) == f"checkpoint={tmp_path / 'missing'}: no such directory"
    empty_run = tmp_path / "run"
    (empty_run / "checkpoints" / "step_000003").mkdir(parents=True)  # half-written: no trainer_state.json
    assert "a run directory without a complete checkpoint" in refused(str(empty_run), out)
    assert "neither a checkpoint" in refused(str(empty_run / "checkpoints" / "step_000003"), out)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("x")
    assert "already exists" in refused(str(full_run), str(tmp_path / "taken"))
    assert "needs checkpoint=DIR" in refused("", out)


def test_grpo_export_on_the_command_line(lora_run: Path, tmp_path: Path) -> None:
    output = tmp_path / "cli"
    result = run_grpo("export", f"checkpoint={lora_run}", f"output={output}", "dtype=fp16")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "largest |logit difference|" in result.stderr and "tolerance" in result.stderr
    assert tensor_dtypes(output / "model.safetensors") == {torch.float16}


def test_a_place_that_cannot_be_written_is_one_line_and_leaves_nothing(full_run: Path) -> None:
    """It was a PermissionError traceback. sysfs refuses a new directory to root as well (EPERM),
    where a read-only directory would not."""
    output = Path("/sys/grpo_export_test/model")
    if not Path("/sys").is_dir() or output.parent.exists():
        pytest.skip("needs a /sys that refuses new directories")
    with pytest.raises(GrpoError) as info:
        run_export(ExportConfig(checkpoint=str(full_run), output=str(output)))
    assert re.fullmatch(
        rf"output={output}: /sys/grpo_export_test: .* \((EPERM|EACCES)\); nothing was written", str(info.value)
    )
    assert not output.parent.exists()


def test_ctrl_c_during_an_export_is_one_line_and_leaves_nothing(
    full_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C while the directory is half written (the weights saved, the tokenizer not yet): it was
    a KeyboardInterrupt traceback. The staging directory and the parents made for it go."""
    from transformers import PreTrainedTokenizerBase

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(PreTrainedTokenizerBase, "save_pretrained", interrupted)  # transformers', not ours
    output = tmp_path / "new" / "deeper" / "model"
    with pytest.raises(SystemExit) as exit_info:
        run_export(ExportConfig(checkpoint=str(full_run), output=str(output)))
    assert exit_info.value.code == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"interrupted: nothing was written to {output}"
    assert list(tmp_path.iterdir()) == []


def cut_short(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # a copy cut short, a disk that filled


def test_a_truncated_weights_file_is_one_line_naming_it(full_run: Path, tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoints" / "step_000002"
    shutil.copytree(full_run / "checkpoints" / "step_000002", checkpoint)
    cut_short(checkpoint / "model.safetensors")
    with pytest.raises(GrpoError) as refused:
        run_export(ExportConfig(checkpoint=str(tmp_path), output=str(tmp_path / "out")))
    message = str(refused.value)
    assert f"{checkpoint / 'model.safetensors'} cannot be read" in message and "\n" not in message, message
    assert not (tmp_path / "out").exists()


# `grpo export` in a process of its own, with a Ctrl-C landing at a chosen moment: while the command
# imports transformers (an import hook sends it), or once the command has returned (its teardown).
CTRL_C_AT = r"""
import os, signal, sys, time
from grpo_cli.cli import main

signal.signal(signal.SIGINT, signal.default_int_handler)  # as a terminal's job has it (a background job ignores it)
when = sys.argv[1]  # the command below replaces sys.argv

class CtrlCOnImport:
    def find_spec(self, name, path=None, target=None):
        if name == "transformers" and when == "import":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, CtrlCOnImport())
main(sys.argv[2:])
if when == "teardown":
    os.kill(os.getpid(), signal.SIGINT)  # the export is written; the interpreter is about to exit
    time.sleep(1)  # the teardown of torch and transformers, where that Ctrl-C lands
"""


def export_with_ctrl_c(when: str, checkpoint: Path, output: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CTRL_C_AT, when, "export", f"checkpoint={checkpoint}", f"output={output}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_ctrl_c_while_export_imports_is_one_line_and_130(full_run: Path, tmp_path: Path) -> None:
    done = export_with_ctrl_c("import", full_run, tmp_path / "out")
    assert done.returncode == 130, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == ["interrupted: grpo export stopped; nothing more was done"]
    assert not (tmp_path / "out").exists()


def test_a_ctrl_c_after_the_export_is_written_leaves_it_a_success(full_run: Path, tmp_path: Path) -> None:
    done = export_with_ctrl_c("teardown", full_run, tmp_path / "out")
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "out" / "README.md").is_file()


def test_an_export_that_runs_out_of_room_is_one_line_and_writes_nothing(full_run: Path, tmp_path: Path) -> None:
    """safetensors' SafetensorError (`os error 27` here, 28 on a full disk) is the OSError it wraps."""
    output = tmp_path / "out"
    with pytest.raises(GrpoError) as refused, files_at_most(4096):
        run_export(ExportConfig(checkpoint=str(full_run), output=str(output)))
    assert str(refused.value) == f"output={output}: {output}: File too large (EFBIG); nothing was written"
    assert list(tmp_path.iterdir()) == []
