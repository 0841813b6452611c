"""`grpo check model=hf model.path=DIR`: the model zoo's equalities on a user's own model, one row of the
support matrix (docs/models.md) and each check's figures or reason; exit 1 when an equality fails.

For a family the zoo does not list: what `grpo train` would do with it, proven on the model itself
before any training run (grpo_cli/model_check.py says what each check compares).
"""

from __future__ import annotations

from pathlib import Path

from grpo_cli.config.schema import CheckConfig
from grpo_cli.errors import GrpoError
from grpo_cli.model_check import check_model_config, matrix_header


def run_check(cfg: CheckConfig, run_dir: Path | None = None) -> float:
    """Prints the report; returns 0 when every equality holds. `run_dir` is unused: check writes nothing."""
    report = check_model_config(cfg.model, cfg.seed)
    print("\n".join([*matrix_header(), report.table_row(), "", *report.lines()]), flush=True)
    if report.failed:
        failing = ", ".join(f.column for f in report.findings if f.failed)
        raise GrpoError(
            f"grpo check: {failing} failed on {cfg.model.path or 'the tiny model'}: training it as it is "
            "would sample or score another model than the one it trains (the lines above say where)"
        )
    return 0.0
