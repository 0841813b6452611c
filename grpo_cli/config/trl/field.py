"""One row of the TRL mapping: a TRL `GRPOConfig` field, TRL's default, and what it is in grpo.

A `TrlField` holds the grpo keys a field sets and, when it is more than a rename, its converter
(grpo_cli/config/trl/values.py); with no keys, `note` says why grpo has none. `same`, `none` and
`already` spell the three common rows in one line each, so the tables read as a list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grpo_cli.config.trl import values as v
from grpo_cli.config.trl.values import Converter, Outcome

HUB = "grpo pushes nothing to the Hub: `grpo export` writes a Hugging Face directory to upload yourself"


@dataclass(frozen=True)
class TrlField:
    name: str  # GRPOConfig's field
    default: Any  # TRL 1.16's (GRPOConfig's own where it changes TrainingArguments')
    keys: tuple[str, ...] = ()  # the grpo keys (or config groups) it sets; () when none
    note: str = ""  # how the value converts, or, with no keys, why grpo has no equivalent
    convert: Converter | None = None  # None with one key: that key takes the value as it is
    overrides_others: bool = False  # its keys win over another field's (generation_kwargs, as in TRL)

    def outcome(self, value: Any, get: v.Lookup) -> Outcome:
        """The grpo overrides `value` becomes (`get` reads the file's other fields)."""
        if self.convert is not None:
            return self.convert(value, get)
        if not self.keys:
            return Outcome(left_out=self.note)
        if isinstance(value, str) and type(self.default) in (int, float):  # YAML 1.1 reads 1e-6 as a string
            value = v.number(value, type(self.default))
        return Outcome({self.keys[0]: value})


def same(name: str, default: Any, key: str, note: str = "") -> TrlField:
    """A rename: `key` takes the value as it is."""
    return TrlField(name, default, (key,), note)


def none(name: str, default: Any, why: str) -> TrlField:
    """No grpo key: any value is left out, with `why`."""
    return TrlField(name, default, (), why)


def already(name: str, default: Any, expected: Any, why: str) -> TrlField:
    """No key, because grpo always runs as TRL does at `expected`; another value is left out with `why`."""
    return TrlField(name, default, (), why, v.only(lambda value: value == expected, why))
