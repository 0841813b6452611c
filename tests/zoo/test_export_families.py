"""Every family of the zoo exports and reloads (issue 53 item 4): the two-step checkpoint of each
family through `grpo export`'s own function, then read back with nothing but transformers'
AutoModelForCausalLM, giving the trained model's logits (fp32, 1e-5)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo_cli.commands.export import run_export
from grpo_cli.config.schema import ExportConfig
from tests.zoo.conftest import ZooRuns
from tests.zoo.test_train_families import NAMES

# Prompts of different lengths in one left-padded batch, longer than the zoo's windows (4 tokens)
IDS = torch.tensor([[0, 0, 0, 7, 41, 42, 43, 44, 45, 46], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20]])
MASK = (IDS != 0).long()


@pytest.mark.parametrize("family", NAMES)
def test_the_family_exports_and_reloads_with_plain_transformers(family: str, zoo_runs: ZooRuns, tmp_path: Path) -> None:
    run = zoo_runs[family]
    if run.error is not None:
        raise run.error
    output = tmp_path / "exported"
    difference = run_export(ExportConfig(checkpoint=str(run.checkpoint), output=str(output), dtype="fp32"))
    assert difference <= 1e-5
    reloaded = AutoModelForCausalLM.from_pretrained(output, dtype=torch.float32).eval()
    assert type(reloaded).__name__ == type(run.model).__name__
    run.model.eval()
    with torch.no_grad():
        trained = run.model(input_ids=IDS, attention_mask=MASK).logits
        exported = reloaded(input_ids=IDS, attention_mask=MASK).logits
    torch.testing.assert_close(exported, trained, atol=1e-5, rtol=0)
