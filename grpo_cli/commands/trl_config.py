"""`grpo train trl_config=FILE`: a TRL GRPOConfig, as users keep it in YAML or JSON, read as overrides.

The file's fields go through the one TRL mapping (grpo_cli/config/trl/mapping.py); what they become
is printed as the equivalent command line, so a user sees, and can keep, what will run, with a line
for each field grpo has no equivalent for. The file's overrides go before the user's own, and a key
given on the command line drops the file's value for it: the command line wins.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path
from typing import Any, TextIO

import yaml

from grpo_cli.commands.overrides import check_overrides
from grpo_cli.config.checks import CHOICES, check_choice
from grpo_cli.config.schema import TrainConfig
from grpo_cli.config.trl.convert import Conversion, TrlFieldError, convert
from grpo_cli.errors import GrpoError

ARG = "trl_config="
PLAIN = re.compile(r"[\w./~-]+")  # a string Hydra reads as the same string, unquoted
WORDS = ("true", "false", "null", "none", "nan", "inf", "-inf")  # ... which it would read as something else


def hydra_value(value: Any) -> str:
    """A value as Hydra's override grammar writes it.

    >>> hydra_value({"enable_thinking": False, "tags": ["a b", 1e-06]})
    "{enable_thinking:false,tags:['a b',1e-06]}"
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{key}:{hydra_value(item)}" for key, item in value.items()) + "}"
    text = str(value)
    if PLAIN.fullmatch(text) and text.lower() not in WORDS and not _is_number(text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _load(path: Path) -> dict[str, Any]:
    """JSON or YAML (JSON is YAML, but its own parser gives its own errors)."""
    if not path.is_file():
        raise GrpoError(f"trl_config={path}: no such file")
    text = path.read_text(encoding="utf-8")
    try:
        fields = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise GrpoError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {err}") from None
    if not isinstance(fields, dict):
        raise GrpoError(f"{path}: expected a mapping of GRPOConfig fields to values, got {type(fields).__name__}")
    return fields


def _arguments(key: str, value: Any) -> list[str]:
    """`key=value`; a mapping entry by entry (`++key.name=value`), as Hydra merges into a free-form
    dict only what is added to it."""
    if isinstance(value, dict) and value:
        return [f"++{key}.{name}={hydra_value(item)}" for name, item in value.items()]
    return [f"{key}={hydra_value(value)}"]


def _check(path: Path, conversion: Conversion) -> list[str]:
    """Each field's overrides through the checks a typed command line gets, the error naming the
    file and the field; returns them as command-line arguments, each once (the batch fields all
    give the same batch)."""
    arguments: list[str] = []
    for name, overrides in conversion.by_field.items():
        written = [arg for key, value in overrides.items() for arg in _arguments(key, value)]
        try:
            check_overrides(written, TrainConfig)
            for key, value in overrides.items():
                if key in CHOICES:
                    check_choice(key, value, CHOICES[key])
        except GrpoError as err:
            raise GrpoError(f"{path}: {name}: {err}") from None
        arguments.extend(arg for arg in written if arg not in arguments)
    return arguments


def _key(argument: str) -> str:
    return argument.split("=", 1)[0].lstrip("+~")


def expand_trl_config(argv: list[str], out: TextIO = sys.stderr) -> list[str]:
    """argv with `trl_config=FILE` replaced by the file's overrides; unchanged without one. Printed
    on `out` (stderr: `--cfg job > config.yaml` keeps a clean stdout)."""
    given = [arg for arg in argv if arg.startswith(ARG)]
    if not given:
        return argv
    if len(given) > 1:
        raise GrpoError(f"{', '.join(given)}: give one trl_config")
    path = Path(given[0].removeprefix(ARG))
    try:
        conversion = convert(_load(path))
    except TrlFieldError as err:
        raise GrpoError(f"{path}: {err}") from None
    own = [arg for arg in argv if arg != given[0]]
    mine = {_key(arg) for arg in own if "=" in arg and not arg.startswith("-")}
    from_file = [arg for arg in _check(path, conversion) if _key(arg) not in mine]
    print(f"{given[0]} is, on grpo's command line:", file=out)
    print("  " + shlex.join(["grpo", "train", *from_file, *own]), file=out)
    for name, why in conversion.left_out.items():
        partly = conversion.by_field.get(name)  # converted, all but what `why` names
        print(f"  {name}: {why}" if partly else f"  {name}: no equivalent in grpo: {why}", file=out)
    if "algo=trl_defaults" not in own:
        print("  fields the file leaves out keep grpo's defaults; algo=trl_defaults gives TRL's", file=out)
    return [*from_file, *own]
