"""Resolve configured reward functions and fuse their outputs into one reward per completion.

Minimal fusion for now: failures become NaN, and the fused reward is the NaN-safe weighted mean
over the functions that scored a sample (DESIGN.md §3); all-NaN samples stay NaN (unscorable).
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from grpo_cli.errors import GrpoError
from grpo_cli.rewards.builtin import BUILTIN_REWARDS


@dataclass
class RewardFunction:
    name: str
    fn: Callable[..., list[float | None]]
    weight: float
    kwargs: dict[str, Any] = field(default_factory=dict)


def _import_target(target: str) -> Callable[..., Any]:
    if target in BUILTIN_REWARDS:
        return BUILTIN_REWARDS[target]
    if ":" not in target:
        raise GrpoError(
            f"reward target '{target}' is neither a builtin ({', '.join(BUILTIN_REWARDS)}) "
            "nor an import path 'package.module:function'"
        )
    module_name, attr = target.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise GrpoError(f"reward target '{target}': cannot import {module_name}: {err}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise GrpoError(f"reward target '{target}': {module_name} has no function {attr}")
    return fn


def _check_signature(name: str, fn: Callable[..., Any]) -> None:
    """Called at start-up so a wrong signature fails before any model loads."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return  # builtins without an introspectable signature: trust them
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < 2 and not any(p.kind is p.VAR_POSITIONAL for p in params):
        raise GrpoError(f"reward '{name}': must accept (prompts, completions, **columns)")


def required_columns(fn: Callable[..., Any]) -> list[str]:
    """Keyword parameters without a default after (prompts, completions): data columns it needs."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return []
    named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)][2:]
    return [p.name for p in named if p.default is p.empty]


def check_columns(functions: list[RewardFunction], columns: list[str]) -> None:
    """A reward that needs a column the data lacks would score NaN forever: refuse it now."""
    for fn in functions:
        missing = [c for c in required_columns(fn.fn) if c not in columns and c not in fn.kwargs]
        if missing:
            raise GrpoError(
                f"reward '{fn.name}' needs data column(s) {missing}; the data has {sorted(columns)}"
            )


def resolve_reward_functions(specs: list[Any]) -> list[RewardFunction]:
    """`specs` are RewardFunctionConfig-like objects with name, target, weight, kwargs."""
    functions = []
    seen = set()
    for spec in specs:
        if spec.name in seen:
            raise GrpoError(f"reward.functions: duplicate name '{spec.name}'")
        seen.add(spec.name)
        fn = _import_target(spec.target)
        _check_signature(spec.name, fn)
        functions.append(RewardFunction(spec.name, fn, float(spec.weight), dict(spec.kwargs)))
    return functions


def _call(
    fn: RewardFunction, prompts: list[Any], completions: list[str], columns: dict[str, list[Any]]
) -> list[float]:
    try:
        values = fn.fn(prompts, completions, **columns, **fn.kwargs)
    except Exception:  # a failing user function must not stop training: its batch scores NaN
        return [math.nan] * len(completions)
    if values is None or len(values) != len(completions):
        return [math.nan] * len(completions)
    out = []
    for v in values:
        try:
            out.append(math.nan if v is None else float(v))
        except (TypeError, ValueError):
            out.append(math.nan)
    return out


def fuse_rewards(
    functions: list[RewardFunction],
    weights: dict[str, float],
    prompts: list[Any],
    completions: list[str],
    columns: dict[str, list[Any]],
) -> tuple[list[float], dict[str, list[float]]]:
    """Returns (fused reward per completion, per-function rewards with NaN for failures)."""
    per_function = {fn.name: _call(fn, prompts, completions, columns) for fn in functions}
    fused = []
    for i in range(len(completions)):
        total = norm = 0.0
        for fn in functions:
            value = per_function[fn.name][i]
            w = weights.get(fn.name, fn.weight)
            if not math.isnan(value) and w > 0:
                total += w * value
                norm += w
        fused.append(total / norm if norm > 0 else math.nan)
    return fused, per_function
