"""The configuration reference, read off the schema: every key's dotted name, type, default and comment.

The comments a user reads in docs/reference.md and in `grpo SUBCOMMAND --keys` are the ones written
beside each field in schema.py and its sections (config/sections/), found by reading their source, so
there is one place to write what a key means. The defaults come from instantiating the dataclasses,
which is the default run.
`python -m grpo_cli.config.reference --write docs/reference.md` regenerates the page and `--check`
(run by .ci/run and tests/docs) fails when the page no longer matches the schema.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import re
import sys
import tokenize
import types
import typing
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from grpo_cli.config import schema as schema_module
from grpo_cli.config.keys import unwrap_optional
from grpo_cli.config.schema import CheckConfig, EvalConfig, ExportConfig, RolloutRunConfig, ScoreConfig, TrainConfig

COMMANDS: tuple[tuple[str, type], ...] = (
    ("train", TrainConfig),
    ("rollout", RolloutRunConfig),
    ("score", ScoreConfig),
    ("eval", EvalConfig),
    ("export", ExportConfig),
    ("check", CheckConfig),
)


@dataclass(frozen=True)
class KeyDoc:
    """One row of the reference."""

    key: str  # dotted, list elements as `name[]`: reward.functions[].weight
    type: str  # as the schema writes it: `float`, `str | None`, `list[int]`
    default: str  # as a Hydra override would write it: `0.2`, `null`, `[1, 5]`, `???` (required)
    comment: str  # the schema's comment on the field, lines joined


@cache
def _field_comments() -> dict[tuple[str, str], str]:
    """(class name, field name) -> the comment lines directly above the field and the one beside it.

    Read from the source because Python keeps no comments at run time; the schema is `schema.py` and
    its section modules, each of flat classes, so a field is an annotated assignment directly in a class body.
    """
    found: dict[tuple[str, str], str] = {}
    modules = {sys.modules[obj.__module__] for obj in vars(schema_module).values() if dataclasses.is_dataclass(obj)}
    for module in sorted(modules, key=lambda module: module.__name__):
        found.update(_module_field_comments(inspect.getsource(module)))
    return found


def _module_field_comments(source: str) -> dict[tuple[str, str], str]:
    """`_field_comments` for one module's source."""
    comments: dict[int, str] = {}  # line number -> comment text
    code_lines: set[int] = set()  # lines holding anything but a comment
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            code_lines.update(range(tok.start[0], tok.end[0] + 1))
    found: dict[tuple[str, str], str] = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        for stmt in node.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            above = []
            line = stmt.lineno - 1
            while line in comments and line not in code_lines:  # a comment block of its own lines
                above.insert(0, comments[line])
                line -= 1
            beside = [comments[stmt.end_lineno]] if stmt.end_lineno in comments else []
            found[(node.name, stmt.target.id)] = " ".join(above + beside)
    return found


def _spell_out_choices(comment: str) -> str:
    """`LOSS_TYPES: how ...` -> `grpo | bnpo | ...: how ...`: a comment names the schema's tuple of
    allowed values, which a reader of the page has never seen."""

    def values(match: re.Match[str]) -> str:
        choices = getattr(schema_module, match.group(0), None)
        return " | ".join(choices) if isinstance(choices, tuple) else match.group(0)

    return re.sub(r"\b[A-Z][A-Z_]{2,}\b", values, comment)


def _comment(owner: type, name: str) -> str:
    """The comment of a field, looked up along the class's bases (ResumableRolloutConfig keeps its parent's)."""
    for cls in owner.__mro__:
        if (cls.__name__, name) in _field_comments():
            return _spell_out_choices(_field_comments()[(cls.__name__, name)])
    return ""


def _type_name(hint: typing.Any) -> str:
    if hint is typing.Any:
        return "any"
    if hint is type(None):
        return "None"
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(arg) for arg in typing.get_args(hint))
    if origin is not None:
        return f"{origin.__name__}[{', '.join(_type_name(arg) for arg in typing.get_args(hint))}]"
    return hint.__name__


def _value(value: typing.Any) -> str:
    """A default as a user writes it in an override."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return value if value else "''"
    if dataclasses.is_dataclass(value):
        return _value(value.name) if hasattr(value, "name") else type(value).__name__
    if isinstance(value, list):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


def key_docs(config: object, prefix: str = "") -> list[KeyDoc]:
    """Every leaf key of `config` (a schema instance: its values are the defaults), in schema order.

    A list of dataclasses (reward.functions, curriculum.phases) gets a row of its own, whose default
    is the list, then one row per element field with the element class's own defaults.
    """
    owner = type(config)
    hints = typing.get_type_hints(owner)
    rows: list[KeyDoc] = []
    for field in dataclasses.fields(owner):
        key, hint, value = f"{prefix}{field.name}", hints[field.name], getattr(config, field.name)
        inner = unwrap_optional(hint)
        item = unwrap_optional(typing.get_args(inner)[0]) if typing.get_origin(inner) is list else None
        if dataclasses.is_dataclass(inner):
            rows.extend(key_docs(value, key + "."))
            continue
        rows.append(KeyDoc(key, _type_name(hint), _value(value), _comment(owner, field.name)))
        if item is not None and dataclasses.is_dataclass(item):
            rows.extend(key_docs(item(), key + "[]."))
    return rows


def _group_intro(cls: type) -> str:
    """A group's docstring, when the schema gives it one, as one paragraph."""
    doc = cls.__doc__ or ""
    if doc.startswith(f"{cls.__name__}("):  # the signature dataclasses writes where the class has none
        return ""
    return " ".join(doc.split())


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _table(rows: list[KeyDoc]) -> list[str]:
    lines = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    lines += [f"| `{r.key}` | `{_cell(r.type)}` | `{_cell(r.default)}` | {_cell(r.comment)} |" for r in rows]
    return lines


def _sections(command: str, config: object, shared: set[KeyDoc]) -> list[str]:
    """The page's part for one command: a section per group (or the keys it does not share with train)."""
    rows = [row for row in key_docs(config) if row not in shared]
    groups: dict[str, list[KeyDoc]] = {}
    for row in rows:
        groups.setdefault(row.key.split(".")[0] if "." in row.key else "", []).append(row)
    lines: list[str] = []
    if command != "train":
        lines += [f"## grpo {command}", ""]
        intro = _group_intro(type(config))
        lines += [intro, ""] if intro else []
        same = sorted({row.key.split(".")[0] for row in key_docs(config) if row in shared})
        if same:
            lines += ["Shared with `grpo train`, with the same defaults: " + ", ".join(f"[`{g}`](#{g})" for g in same)]
            lines += [""]
    level = "##" if command == "train" else "###"
    for group, group_rows in groups.items():
        if command == "train":
            title = group or "top level"
        else:
            title = f"grpo {command}: {group}.*" if group else f"grpo {command}: top level"
        lines += [f"{level} {title}", ""]
        hint = typing.get_type_hints(type(config)).get(group) if group else None
        intro = _group_intro(unwrap_optional(hint)) if hint is not None and dataclasses.is_dataclass(hint) else ""
        lines += [intro, ""] if intro else []
        lines += _table(group_rows) + [""]
    return lines


def render() -> str:
    """docs/reference.md."""
    lines = [
        "# Configuration keys",
        "",
        "<!-- Generated by `python -m grpo_cli.config.reference --write docs/reference.md` from",
        "grpo_cli/config/schema.py; do not edit: CI fails when this page and the schema differ. -->",
        "",
        "Every key of every command by its full dotted name, with its type, its default (the default run: what",
        "`grpo train` composes with no overrides) and the comment the schema carries. Set any of them on the command",
        "line (`grpo train algo.beta=0.04`), in a recipe, or see them for one prefix with",
        "`grpo train --keys algo.adaptive_clip`. A group option (`algo=dapo`, `reward=code`) changes some of these",
        "defaults: `grpo train algo=dapo --cfg job` prints the composed result. `???` marks a value that must be",
        "given.",
        "",
    ]
    shared: set[KeyDoc] = set()
    for command, schema in COMMANDS:
        config = schema()
        lines += _sections(command, config, shared)
        if command == "train":
            shared = set(key_docs(config))
    return "\n".join(lines).rstrip() + "\n"


def print_keys(schema: type, prefix: str = "", out: typing.TextIO = sys.stdout) -> int:
    """`grpo SUBCOMMAND --keys [PREFIX]`: the reference's rows for one command, as plain lines."""
    rows = [row for row in key_docs(schema()) if row.key == prefix or row.key.startswith(prefix)]
    if not rows:
        print(f"no key of this command starts with '{prefix}'", file=sys.stderr)
        return 2
    width = max(len(row.key) for row in rows)
    for row in rows:
        print(f"{row.key:<{width}}  {row.type} = {row.default}", file=out)
        if row.comment:
            print(f"{'':<{width}}  {row.comment}", file=out)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write or check docs/reference.md from the schema.")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", type=Path, metavar="FILE", help="write the reference page to FILE")
    action.add_argument("--check", type=Path, metavar="FILE", help="exit 1 when FILE differs from the schema's page")
    args = parser.parse_args(argv)
    text = render()
    if args.write:
        args.write.write_text(text, encoding="utf-8")
        return 0
    if not args.check.is_file() or args.check.read_text(encoding="utf-8") != text:
        print(
            f"{args.check} is out of date with grpo_cli/config/schema.py: run "
            f"python -m grpo_cli.config.reference --write {args.check}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
