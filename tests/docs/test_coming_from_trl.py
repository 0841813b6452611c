"""docs/coming-from-trl.md keeps up with TRL and with the mapping: every GRPOConfig field of the
installed TRL is on the page, and its table is the one grpo_cli/config/trl_mapping.py writes."""

from __future__ import annotations

import dataclasses

import pytest

from grpo_cli.config.trl_mapping import FIELDS
from grpo_cli.config.trl_page import BEGIN, main, rewritten
from tests.conftest import REPO

PAGE = REPO / "docs" / "coming-from-trl.md"


def test_every_grpo_config_field_of_the_installed_trl_is_on_the_page() -> None:
    """GRPOConfig's own fields, and the TrainingArguments ones the mapping chose: a TRL release that
    adds a field fails here, naming it, until the mapping (and so the page) has it."""
    trl = pytest.importorskip("trl", reason="pip install 'grpo-cli[bench]'")
    transformers = pytest.importorskip("transformers")
    trainer = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    fields = [f.name for f in dataclasses.fields(trl.GRPOConfig) if f.name not in trainer or f.name in FIELDS]
    assert len(fields) > 100  # GRPOConfig's 77 and the TrainingArguments a GRPO run turns
    table = PAGE.read_text(encoding="utf-8").split(BEGIN, 1)[1]
    missing = [name for name in fields if f"| `{name}` |" not in table]
    assert not missing, (
        f"GRPOConfig fields missing from docs/coming-from-trl.md (add them to trl_mapping.py): {missing}"
    )


def test_the_pages_table_is_the_mappings() -> None:
    page = PAGE.read_text(encoding="utf-8")
    assert rewritten(page) == page, "stale: python -m grpo_cli.config.trl_page --write docs/coming-from-trl.md"
    assert main(["--check", str(PAGE)]) == 0


def test_the_check_fails_on_a_stale_table(tmp_path) -> None:
    stale = tmp_path / "page.md"
    stale.write_text(PAGE.read_text(encoding="utf-8").replace("| `beta` |", "| `beta_renamed` |"), encoding="utf-8")
    assert main(["--check", str(stale)]) == 1
    assert main(["--write", str(stale)]) == 0 and stale.read_text(encoding="utf-8") == PAGE.read_text(encoding="utf-8")
