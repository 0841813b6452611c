"""The schema walk: which dotted keys a config schema has, and the nearest valid one to a wrong key.

Apart from the value checks because it asks another question of every key a user writes, on the
command line or in a recipe: does it exist at all? It follows the dataclass types, not values;
tests/config walks the same steps to list every documented key.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing

from grpo_cli.config.schema import TrainConfig
from grpo_cli.errors import GrpoError

FREE_FORM = typing.Any  # e.g. reward.functions.N.kwargs.*: the function's own keyword arguments


def unwrap_optional(hint: typing.Any) -> typing.Any:
    """`X | None` -> X; anything else unchanged."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def child_hint(hint: typing.Any, part: str) -> typing.Any:
    """The type below `part` in a node of type `hint`, FREE_FORM where anything goes, or None
    when `part` cannot follow: the one step of the walk shared with tests/config."""
    hint = unwrap_optional(hint)
    if hint is typing.Any:
        return FREE_FORM
    if dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint)
        return hints.get(part)
    origin = typing.get_origin(hint)
    if origin is list:
        return typing.get_args(hint)[0] if part.isdigit() else None
    if origin is dict:
        return typing.get_args(hint)[1]
    return None  # below a scalar


def leaf_keys(schema: type, prefix: str = "") -> list[str]:
    """Every leaf key of a schema by the same type rules, list elements as `name[]`:
    reward.functions[].weight, curriculum.phases[].weights, data.operations."""
    keys = []
    for name, hint in typing.get_type_hints(schema).items():
        key = f"{prefix}{name}"
        hint = unwrap_optional(hint)
        item = typing.get_args(hint)[0] if typing.get_origin(hint) is list else None
        if dataclasses.is_dataclass(hint):
            keys.extend(leaf_keys(hint, key + "."))
        elif item is not None and dataclasses.is_dataclass(unwrap_optional(item)):
            keys.extend(leaf_keys(unwrap_optional(item), key + "[]."))
        else:
            keys.append(key)  # a scalar, a list of scalars, a mapping, Any
    return keys


def _resolves(parts: list[str], hint: typing.Any) -> bool:
    for part in parts:
        hint = child_hint(hint, part)
        if hint is None:
            return False
        if hint is FREE_FORM:
            return True
    return True


def _dotted_fields(schema: type, prefix: str = "") -> list[str]:
    """Every dotted key through dataclass fields (not into lists or dicts): did-you-mean candidates."""
    keys = []
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        key = f"{prefix}{f.name}"
        keys.append(key)
        hint = unwrap_optional(hints[f.name])
        if dataclasses.is_dataclass(hint):
            keys.extend(_dotted_fields(hint, key + "."))
    return keys


def _placed_elsewhere(parts: list[str], schema: type) -> list[str]:
    """The valid keys that end in the whole of `parts`: `seed` is `train.seed` (and `data.seed`) to
    `grpo train`, where eval and rollout have a top-level `seed`. train.* first: the training loop's
    section holds what those commands keep at the top (seed, device, threads)."""
    tail = "." + ".".join(parts)
    found = [k for k in _dotted_fields(schema) if k.endswith(tail)]
    return sorted(found, key=lambda k: not k.startswith("train."))  # stable: schema order otherwise


def _nearest(parts: list[str], i: int, hint: typing.Any, schema: type) -> str | None:
    """The valid key nearest to `parts`, which is valid up to `parts[i]`: the same name in another
    section before any near spelling (difflib would offer `sweep` for `seed`)."""
    if elsewhere := _placed_elsewhere(parts, schema):
        return " or ".join(elsewhere)
    prefix, rest = parts[:i], parts[i + 1 :]
    hint = unwrap_optional(hint)
    if dataclasses.is_dataclass(hint):
        names = [f.name for f in dataclasses.fields(hint)]
        fitting = [n for n in names if _resolves(rest, child_hint(hint, n))]
        for pool in (fitting, names):
            close = difflib.get_close_matches(parts[i], pool, n=1, cutoff=0.6)
            if close:
                tail = rest if close[0] in fitting else []
                return ".".join([*prefix, close[0], *tail])
    if typing.get_origin(hint) is list:  # reward.functions.exact_match.weight: an index was meant
        return ".".join([*prefix, "0", *rest]) if rest and _resolves(["0", *rest], hint) else None
    ancestors = {".".join(parts[:j]) for j in range(1, len(parts))}
    candidates = [k for k in _dotted_fields(schema) if k not in ancestors]
    close = difflib.get_close_matches(".".join(parts), candidates, n=1, cutoff=0.6)
    return close[0] if close else None


def check_key(key: str, schema: type = TrainConfig) -> None:
    """Raise a GrpoError naming `key` and the nearest valid key when the schema lacks it.

    The walk follows the types: a dataclass field must exist, a `list[X]` takes an integer index
    then X, a `dict[str, X]` any key then X; under `Any` (reward kwargs) anything goes.
    """
    parts = key.split(".")
    hint: typing.Any = schema
    for i, part in enumerate(parts):
        below = child_hint(hint, part)
        if below is FREE_FORM:
            return
        if below is None:
            parent, node = ".".join(parts[:i]), unwrap_optional(hint)
            if i and typing.get_origin(node) not in (list, dict) and not dataclasses.is_dataclass(node):
                raise GrpoError(f"unknown config key {key}: {parent} is a value, not a section")
            close = _nearest(parts, i, hint, schema)
            suffix = f"; did you mean {close}?" if close else ""
            if typing.get_origin(node) is list:
                suffix = f" ({parent} takes a list index){suffix}"
            raise GrpoError(f"unknown config key {key}{suffix}")
        hint = below
