"""The field table of docs/coming-from-trl.md, written from the TRL mapping so the page cannot drift.

The page is prose around one generated block between BEGIN and END; `python -m
grpo_cli.config.trl.page --write docs/coming-from-trl.md` rewrites the block, `--check` (run by
.ci/run and tests/docs) fails when it differs from grpo_cli/config/trl/mapping.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from grpo_cli.config.trl.mapping import SECTIONS, TRAINER_FALLBACK, TRAINER_REASONS, TrlField

BEGIN = "<!-- generated from grpo_cli/config/trl/mapping.py by python -m grpo_cli.config.trl.page --write -->"
END = "<!-- end of the generated table -->"
HEADER = "| TRL field | TRL default | grpo | how, or why none |"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _default(value: Any) -> str:
    return f"`{value!r}`" if not isinstance(value, str) else f"`{json.dumps(value)}`"


def _row(field: TrlField) -> str:
    keys = ", ".join(f"`{key}`" for key in field.keys) if field.keys else "none"
    return f"| `{field.name}` | {_default(field.default)} | {_cell(keys)} | {_cell(field.note)} |"


def render_table() -> str:
    lines = [BEGIN]
    for section, fields in SECTIONS.items():
        lines += ["", f"### {section}", "", HEADER, "|---|---|---|---|"]
        lines += [_row(field) for field in fields]
    lines += ["", "### Any other TrainingArguments field", "", "| fields | why none |", "|---|---|"]
    for prefixes, reason in TRAINER_REASONS:
        lines.append(f"| {', '.join(f'`{p}*`' for p in prefixes)} | {_cell(reason)} |")
    lines += [f"| the rest | {TRAINER_FALLBACK} |", "", END]
    return "\n".join(lines)


def rewritten(page: str) -> str:
    """The page with its generated block replaced by the mapping's."""
    if BEGIN not in page or END not in page:
        raise ValueError(f"the page lacks the markers of its generated table:\n{BEGIN}\n{END}")
    head, rest = page.split(BEGIN, 1)
    return head + render_table() + rest.split(END, 1)[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write or check the TRL field table of docs/coming-from-trl.md.")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", metavar="PAGE", type=Path)
    mode.add_argument("--check", metavar="PAGE", type=Path)
    args = parser.parse_args(argv)
    path = args.write or args.check
    page = path.read_text(encoding="utf-8")
    if args.write:
        path.write_text(rewritten(page), encoding="utf-8")
        return 0
    if rewritten(page) != page:
        print(f"{path} is stale: python -m grpo_cli.config.trl.page --write {path}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
