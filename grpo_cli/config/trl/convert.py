"""A TRL config's fields through the mapping (grpo_cli/config/trl/mapping.py): which fields exist,
what each becomes, and the contradictions only the whole file shows (two fields setting one key)."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from grpo_cli.config.trl.mapping import FIELDS, trainer_reason
from grpo_cli.config.trl.values import BadTrlValue


@cache
def trainer_fields() -> frozenset[str]:
    """The installed transformers' TrainingArguments fields: valid in a TRL config, though most are
    the Trainer's machinery (imported on demand: it pulls in torch)."""
    from transformers import TrainingArguments

    return frozenset(f.name for f in dataclasses.fields(TrainingArguments))


class TrlFieldError(ValueError):
    """A field of a TRL config that cannot be converted; `field` names it for the CLI's message."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Conversion:
    by_field: dict[str, dict[str, Any]]  # each field of the file -> the overrides it became (in file order)
    left_out: dict[str, str]  # field -> why (part of) its value has no equivalent in grpo

    @property
    def overrides(self) -> dict[str, Any]:
        return {key: value for overrides in self.by_field.values() for key, value in overrides.items()}


def check_known(names: list[str]) -> None:
    known = set(FIELDS) | trainer_fields()
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise TrlFieldError(name, f"{name} is not a field of TRL's GRPOConfig{hint}")


def convert(values: Mapping[str, Any]) -> Conversion:
    """A TRL config's fields (GRPOConfig's keyword arguments) as grpo overrides.

    Every field the file gives is converted, a value equal to TRL's default included: grpo's
    defaults are not TRL's (loss_type, learning_rate, ...), so a field the user wrote down must
    reach the run whatever its value. A field the file leaves out keeps grpo's default; the
    `algo=trl_defaults` preset holds TRL's where the algorithm differs.

    >>> convert({"loss_type": "dapo", "epsilon": 0.2, "push_to_hub": False}).overrides
    {'algo.loss_type': 'dapo', 'algo.epsilon_low': 0.2, 'algo.epsilon_high': 0.2}
    """
    check_known(list(values))

    def get(name: str) -> Any:
        return values[name] if name in values else FIELDS[name].default

    by_field: dict[str, dict[str, Any]] = {}
    left_out: dict[str, str] = {}
    given: dict[str, str] = {}  # grpo key -> the field that set it
    # a field whose keys win (generation_kwargs) goes last, so the others' values for them are known
    order = sorted(values, key=lambda name: name in FIELDS and FIELDS[name].overrides_others)
    for name in order:
        value = values[name]
        if name not in FIELDS:
            left_out[name] = trainer_reason(name)
            continue
        try:
            outcome = FIELDS[name].outcome(value, get)
        except BadTrlValue as err:
            raise TrlFieldError(name, f"{name}={value!r}: {err}") from None
        for key, new in outcome.overrides.items():
            other = given.get(key)
            if other is not None and by_field[other][key] != new:
                if not FIELDS[name].overrides_others:
                    old = by_field[other][key]
                    raise TrlFieldError(name, f"{name}={value!r} sets {key}={new!r}, but {other} set it to {old!r}")
                del by_field[other][key]
            given[key] = name
        by_field[name] = dict(outcome.overrides)
        if outcome.left_out:
            left_out[name] = outcome.left_out
    return Conversion(by_field, left_out)
