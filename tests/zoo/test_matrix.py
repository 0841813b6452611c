"""docs/models.md's support matrix is what the zoo gives today (issue 53 item 7): `grpo check`'s checks on
every family, regenerated here and compared with the page, so that the page cannot drift from the
code or from the installed transformers. Plus `grpo check` as a user runs it, and its exit code."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from grpo_cli.config.schema import RolloutConfig
from grpo_cli.model_check import COLUMNS, GENERATIONS, MAX_NEW_TOKENS, check_sampling
from grpo_cli.models import load_tokenizer
from tests.conftest import REPO, run_grpo
from tests.zoo.matrix import BEGIN, END, render, replaced, zoo_reports

PAGE = REPO / "docs" / "models.md"


def test_the_support_matrix_page_is_what_the_zoo_gives(zoo_dirs: dict[str, Path]) -> None:
    reports = zoo_reports(zoo_dirs)
    page = PAGE.read_text(encoding="utf-8")
    assert BEGIN in page and END in page, f"{PAGE} lost the matrix's markers"
    assert replaced(page, render(reports)) == page, (
        "docs/models.md's support matrix differs from the zoo's results: "
        "python -m tests.zoo.matrix --write docs/models.md (and read the diff: a cell that got worse is a regression)"
    )
    # every equality the matrix shows holds on every family: a failing one is a bug to fix, not a row to publish
    failing = {r.model_type: [f.detail for f in r.findings if f.failed] for r in reports if r.failed}
    assert not failing, failing
    assert all(r.cell(column).cell for r in reports for column in COLUMNS)


# A user's model whose own code decodes with its cache unlike its full forward (a cache bug of its own):
# nothing fails to load or run, and every sampled token would be scored by another model.
DECODES_ANOTHER_MODEL = """
from transformers import LlamaForCausalLM


class DecodesAnotherModel(LlamaForCausalLM):
    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if cache is not None and out.logits.size(1) == 1 and cache.get_seq_length() > 1:
            out.logits = out.logits * 1.5  # a decoding step: sharper than the full forward
        return out
"""


def decoding_another_model(directory: Path, like: Path) -> Path:
    """`like`'s model and tokenizer in `directory`, its class DecodesAnotherModel (the directory's own code)."""
    shutil.copytree(like, directory)
    (directory / "modeling_decodes.py").write_text(DECODES_ANOTHER_MODEL, encoding="utf-8")
    config = json.loads((directory / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_decodes.DecodesAnotherModel"}
    (directory / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return directory


def test_grpo_check_prints_the_row_and_exits_0_when_every_equality_holds(zoo_dirs: dict[str, Path]) -> None:
    result = run_grpo("check", "model=hf", f"model.path={zoo_dirs['gemma3_text']}", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    row = next(line for line in result.stdout.splitlines() if line.startswith("| gemma3_text |"))
    assert "packed = padded" in row and "Gemma3DecoderLayer" in row
    assert "all equalities hold" in result.stdout


def test_grpo_check_exits_1_naming_the_equality_that_fails(zoo_dirs: dict[str, Path], tmp_path: Path) -> None:
    directory = decoding_another_model(tmp_path / "model", zoo_dirs["llama"])
    result = run_grpo(
        "check",
        "model=hf",
        f"model.path={directory}",
        "model.trust_remote_code=true",
        env={"HF_MODULES_CACHE": str(tmp_path / "modules")},  # where transformers copies the model's code
        timeout=300,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert "FAIL sampling: generate loop" in result.stdout  # the fast loop's probe refused it already
    assert "ok   layout: packed vs padded" in result.stdout  # one full forward per layout: unaffected
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: grpo check: sampling failed on {directory}: training it as it is would sample or score another "
        "model than the one it trains (the lines above say where)"
    )


def test_the_sampler_equality_holds_through_generate_too(zoo_dirs: dict[str, Path]) -> None:
    """The check's other loop, for a model the fast loop's probe refuses: transformers' generate, its
    logits read back (output_logits) against a fresh forward; on a hybrid, whose cache holds states."""
    directory = zoo_dirs["qwen3_5_text"]
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    cfg = RolloutConfig(loop="generate", num_generations=GENERATIONS, max_new_tokens=MAX_NEW_TOKENS)
    torch.manual_seed(0)
    finding, rollout = check_sampling(model, load_tokenizer(directory), cfg)
    assert finding.cell == "generate" and not finding.failed, finding.detail
    assert rollout is not None and len(set(rollout.lengths.tolist())) > 1  # rows ended at different steps
