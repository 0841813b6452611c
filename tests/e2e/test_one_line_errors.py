"""Where a traceback used to be due and one line is: a device the machine lacks, a value of the
wrong type on the command line, a run that cannot write, and an adapter-only export as model.path."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from grpo_cli.commands.errors import report_user_errors
from grpo_cli.commands.overrides import check_overrides
from grpo_cli.config.schema import LoraConfig, ModelConfig, RewardFunctionConfig, TrainConfig
from grpo_cli.errors import GrpoError
from grpo_cli.models import load_policy, pick_device
from grpo_cli.rewards.sources import resolve_reward_sources
from grpo_cli.rollout.prompts import PromptEncoder
from tests.conftest import run_grpo

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("cuda:99", "device 'cuda:99': (this torch is a CPU build|torch sees no CUDA device|this machine has)"),
        ("gpu", r"device 'gpu': not a device name \(auto, cpu, cuda, cuda:N\)"),
    ],
)
def test_a_device_this_machine_lacks_is_one_line(name: str, says: str) -> None:
    with pytest.raises(GrpoError, match=says):
        pick_device(name)
    assert pick_device("cpu") == CPU


def test_a_value_of_the_wrong_type_is_one_line_naming_key_and_value() -> None:
    with pytest.raises(GrpoError, match=r"^optim\.lr=abc: Value 'abc' of type 'str' could not be converted to Float$"):
        check_overrides(["optim.lr=abc"], TrainConfig)
    with pytest.raises(GrpoError, match=r"^optim\.lr=abc: "):  # each value of a sweep
        check_overrides(["-m", "optim.lr=1e-3,abc"], TrainConfig)
    with pytest.raises(GrpoError, match=r"^train\.steps=1\.5: "):
        check_overrides(["train.steps=1.5"], TrainConfig)
    check_overrides(["optim.lr=3e-3", "train.steps=5", "optim.lr=${optim.weight_decay}"], TrainConfig)
    result = run_grpo("train", "optim.lr=abc")  # as the user sees it: no Hydra block
    assert result.returncode == 1
    assert result.stderr.strip() == "error: optim.lr=abc: Value 'abc' of type 'str' could not be converted to Float"


def test_an_adapter_only_export_loads_as_model_path_and_a_lost_base_is_one_line(tmp_path: Path) -> None:
    lora = ModelConfig(lora=LoraConfig(enabled=True, target_modules=["q_proj", "v_proj"]))
    policy, tokenizer, base = load_policy(lora, tmp_path / "run", seed=0, device=CPU, precision_dtype="fp32")
    with torch.no_grad():  # B starts at zero: move it, so the adapter changes the logits
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.5)
    adapter = tmp_path / "adapter"  # what `grpo export merge_lora=false` writes: peft's files, no trainer_state.json
    policy.save_pretrained(adapter)
    tokenizer.save_pretrained(adapter)
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(base)
    ids, mask = PromptEncoder(tokenizer, 32, CPU)(["12+7="])
    model, _, loaded_base = load_policy(
        ModelConfig(kind="hf", path=str(adapter)), tmp_path / "x", seed=0, device=CPU, precision_dtype="fp32"
    )
    assert loaded_base == base
    with torch.no_grad():
        expected = policy.eval()(input_ids=ids, attention_mask=mask).logits
        torch.testing.assert_close(model.eval()(input_ids=ids, attention_mask=mask).logits, expected)
    config["base_model_name_or_path"] = str(tmp_path / "gone")
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(GrpoError, match=rf"model.path={adapter}: a LoRA adapter whose base model .*gone"):
        load_policy(
            ModelConfig(kind="hf", path=str(adapter)), tmp_path / "x", seed=0, device=CPU, precision_dtype="fp32"
        )


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full to fill a disk")
def test_a_full_disk_stops_the_run_in_one_line_naming_the_file_and_the_checkpoint_that_stands(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "completions").mkdir(parents=True)
    full = run_dir / "completions" / "step_000002.jsonl"
    full.symlink_to("/dev/full")  # step 2's completion log lands on a disk with no space left
    result = run_grpo(
        "train",
        "train.steps=3",
        "train.prompts_per_step=2",
        "rollout.num_generations=2",
        "train.save_every=1",
        "monitor.log_completions_every=1",
        "monitor.plots=false",
        "train.device=cpu",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert "Traceback" not in result.stderr
    assert last == (
        f"error: {full}: No space left on device (ENOSPC); the run stopped; its checkpoints stand (newest "
        f"{run_dir / 'checkpoints' / 'step_000001'}): resume with the same command once it can write"
    )


def test_a_reward_file_with_a_syntax_error_names_its_file_and_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # was a ModuleNotFoundError (the first import, before the working directory joins sys.path),
    # then the SyntaxError's traceback
    module = tmp_path / "rewards_with_a_typo_52.py"
    module.write_text("def good(prompts, completions, **_):\n    return [1.0 for c in completions\n")
    monkeypatch.chdir(tmp_path)
    spec = RewardFunctionConfig(name="good", target="rewards_with_a_typo_52:good")
    with pytest.raises(GrpoError, match=rf"^reward target 'rewards_with_a_typo_52:good': {module}:2: SyntaxError: "):
        resolve_reward_sources([spec])
    # a module that raises as it runs: what and where, in one line
    spec = RewardFunctionConfig(name="good", target="rewards_failing_52:good")
    (tmp_path / "rewards_failing_52.py").write_text("x = 1\nraise RuntimeError('no API key set')\n")
    where = tmp_path / "rewards_failing_52.py"
    says = rf"^reward target 'rewards_failing_52:good': importing it raised RuntimeError: no API key set \({where}:2\)$"
    with pytest.raises(GrpoError, match=says):
        resolve_reward_sources([spec])


def test_user_text_in_an_error_line_is_printed_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    """Never markup nor emoji codes: the target `a:b:c` printed as `a🅱c`, `[red]` vanished."""
    spec = RewardFunctionConfig(name="r", target="a:b:c")
    with pytest.raises(SystemExit) as exit_:
        report_user_errors(lambda: resolve_reward_sources([spec]))
    assert exit_.value.code == 1
    printed = capsys.readouterr().err
    assert printed.startswith("error: reward target 'a:b:c': "), printed
    with pytest.raises(SystemExit):
        report_user_errors(lambda: (_ for _ in ()).throw(GrpoError("data.path=[red]x:smile:.jsonl: no such file")))
    assert capsys.readouterr().err == "error: data.path=[red]x:smile:.jsonl: no such file\n"
