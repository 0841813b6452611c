"""Reward sources: each configured reward resolved to a callable and checked before any model loads.

A source is a plain function `f(prompts, completions, **columns) -> list[float | None]` named by a
builtin name or an import path, or a local reward model behind the same signature (`model_path`).
A function written for TRL (`def f(completions, **kwargs)`, ...) is wrapped to be called TRL's way
(rewards/trl_style.py).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pickle
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from grpo_cli.config.schema import NORMALIZATIONS, ON_ROW_ERROR, RewardFunctionConfig, SandboxConfig
from grpo_cli.errors import GrpoError
from grpo_cli.rewards.batch import COMPLETION_IDS, COMPLETION_LENGTHS

if TYPE_CHECKING:
    from transformers import TrainerState
from grpo_cli.rewards.builtin import BUILTIN_REWARDS
from grpo_cli.rewards.trl_style import (
    CALLING_CONVENTIONS,
    SIGNATURES,
    TrlStyleReward,
    calling_convention,
)


@dataclass
class RewardSource:
    """One reward in the fusion: its callable and how the fusion and the executor treat it."""

    name: str
    fn: Callable[..., Sequence[float | None]]
    weight: float = 1.0
    normalize: str = "none"  # none | zscore | sigmoid | group_zscore (docs/architecture.md §3)
    fallback: str | None = None  # takes this source's weight once it is masked
    kwargs: dict[str, Any] = field(default_factory=dict)  # extra keyword arguments, after the data columns
    timeout_s: float | None = None  # None: the executor's default; <= 0: no limit
    parallel: bool = False  # may run in a worker process: picklable by reference, no state kept across calls
    ema_momentum: float | None = None  # zscore running-stats momentum; None: the fusion's (reward.ema_momentum)
    on_row_error: str = "zero"  # zero | skip: a row the function raised on (RewardFunctionConfig.on_row_error)


def import_module_here(name: str) -> ModuleType:
    """`name`, found as `python -m` finds it: also in the working directory, which the `grpo`
    console script, unlike `python -m grpo_cli`, does not put on sys.path. The directory is
    appended, not prepended: an installed package keeps its name, and a `datasets.py` lying here
    cannot shadow the library. It stays on sys.path, so spawned reward workers find it too."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        top, here = name.partition(".")[0], Path.cwd()
        if err.name != top or not ((here / f"{top}.py").is_file() or (here / top).is_dir()):
            raise
        if str(here) not in sys.path:
            sys.path.append(str(here))
        importlib.invalidate_caches()
        return importlib.import_module(name)


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
        module = import_module_here(module_name)
    except SyntaxError as err:  # the user's file: where to look, not Python's import machinery
        raise GrpoError(f"reward target '{target}': {err.filename}:{err.lineno}: SyntaxError: {err.msg}") from None
    except ImportError as err:
        raise GrpoError(f"reward target '{target}': cannot import {module_name}: {err}") from None
    except Exception as err:  # the user's module raised as it ran (a missing API key, a bad path)
        frame = traceback.extract_tb(err.__traceback__)[-1]
        raised = f"{type(err).__name__}: {err} ({frame.filename}:{frame.lineno})"
        raise GrpoError(f"reward target '{target}': importing it raised {raised}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise GrpoError(f"reward target '{target}': {module_name} has no function {attr}")
    return fn


def _check_signature(name: str, fn: Callable[..., Any], calling: str) -> None:
    """Called at start-up so a wrong signature fails before any model loads."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return  # builtins without an introspectable signature: trust them
    if calling == "trl":  # called by keyword: it must take completions, prompts or **kwargs
        if not {"prompts", "completions"} & {p.name for p in params} and all(
            p.kind is not p.VAR_KEYWORD for p in params
        ):
            raise GrpoError(
                f"reward '{name}': takes neither prompts nor completions; the signatures that work: {SIGNATURES}"
            )
        return
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < 2 and not any(p.kind is p.VAR_POSITIONAL for p in params):
        raise GrpoError(
            f"reward '{name}': cannot be called with (prompts, completions); the signatures that work: {SIGNATURES}"
        )


def _check_picklable(name: str, fn: Callable[..., Any], kwargs: dict[str, Any]) -> None:
    """Worker processes are spawned, so the function travels by reference: a lambda or a closure
    would fail on the first batch; say so now."""
    try:
        pickle.dumps((fn, kwargs))
    except Exception as err:  # pickle raises several types (PicklingError, AttributeError, TypeError)
        raise GrpoError(
            f"reward '{name}': parallel=true needs a module-level function and picklable kwargs "
            f"(it runs in a worker process): {err}"
        ) from None


def required_columns(fn: Callable[..., Any]) -> list[str]:
    """Keyword parameters without a default after (prompts, completions): data columns it needs.

    >>> def f(prompts, completions, answer, hint=None, **_): ...
    >>> required_columns(f)
    ['answer']
    """
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return []
    named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)][2:]
    return [p.name for p in named if p.default is p.empty]


def check_columns(sources: list[RewardSource], columns: list[str]) -> None:
    """A reward that needs a column the data lacks, or cannot take a column the data has (no
    `**kwargs` and no parameter of that name), would fail every batch: refuse it now, binding its
    signature to exactly what the executor passes (the data's columns, `completion_lengths`, its
    `kwargs`)."""
    for source in sources:
        # token counts reach every reward, as a column; token ids only a function that names them
        passed_columns = [*columns, COMPLETION_LENGTHS, *([COMPLETION_IDS] if names_completion_ids(source.fn) else [])]
        missing = [c for c in required_columns(source.fn) if c not in passed_columns and c not in source.kwargs]
        if missing:
            raise GrpoError(
                f"reward '{source.name}' needs {missing}: give them as data columns (the data has "
                f"{sorted(columns)}) or in its `kwargs`"
            )
        try:
            signature = inspect.signature(source.fn)
        except (TypeError, ValueError):
            continue  # builtins without an introspectable signature: trust them
        passed = {**dict.fromkeys(passed_columns), **source.kwargs}
        try:
            signature.bind([], [], **passed)
        except TypeError as err:
            raise GrpoError(
                f"reward '{source.name}' cannot take what every batch passes it ({err}): it is called as "
                f"f(prompts, completions, **columns) with the data's columns {sorted(columns)}, "
                f"'{COMPLETION_LENGTHS}' and its kwargs; add **kwargs (or **_) to its parameters"
            ) from None


def _validate(specs: list[RewardFunctionConfig]) -> None:
    """Cheap checks first, so a typo fails before an import or a reward model load."""
    names = [spec.name for spec in specs]
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise GrpoError(f"reward.functions: duplicate name '{spec.name}'")
        seen.add(spec.name)
    for spec in specs:
        if spec.normalize is not None and spec.normalize not in NORMALIZATIONS:
            raise GrpoError(
                f"reward '{spec.name}': normalize '{spec.normalize}' is not one of {', '.join(NORMALIZATIONS)}"
            )
        if spec.fallback == spec.name:
            raise GrpoError(f"reward '{spec.name}': fallback cannot be the function itself")
        if spec.fallback is not None and spec.fallback not in names:
            raise GrpoError(
                f"reward '{spec.name}': fallback '{spec.fallback}' is not a configured reward function "
                f"({', '.join(names)})"
            )
        if spec.ema_momentum is not None and not 0 <= spec.ema_momentum < 1:
            raise GrpoError(f"reward '{spec.name}': ema_momentum {spec.ema_momentum} must be in [0, 1)")
        if spec.calling not in CALLING_CONVENTIONS:
            raise GrpoError(
                f"reward '{spec.name}': calling '{spec.calling}' is not one of {', '.join(CALLING_CONVENTIONS)}"
            )
        if spec.on_row_error not in ON_ROW_ERROR:
            raise GrpoError(
                f"reward '{spec.name}': on_row_error '{spec.on_row_error}' is not one of {', '.join(ON_ROW_ERROR)}"
            )
        if not spec.model_path and not spec.target:
            raise GrpoError(f"reward '{spec.name}': set target (a function) or model_path (a reward model)")


def resolve_reward_sources(
    specs: list[RewardFunctionConfig],
    device: str = "auto",
    sandbox: SandboxConfig | None = None,
    chat: bool = False,
    trainer_state: TrainerState | None = None,
) -> list[RewardSource]:
    """Resolve `reward.functions` into sources.

    `device` is where reward models go when a spec names none (the trainer passes the policy's).
    A function called TRL's way (`calling_convention`) gets its prompts and completions as messages
    when `chat` (data.chat: TRL's conversational data) and `trainer_state`, which the trainer
    moves on each step (None: a fresh TrainerState, step 0, as for `grpo score`).
    `normalize` unset (None) means `zscore` for reward models (unbounded logits) and `none` otherwise.
    `sandbox` (the `sandbox.*` section) gives keyword defaults to functions that run code: those
    with a true `takes_sandbox_settings` attribute; a spec's own `kwargs` win.
    """
    _validate(specs)
    sources = []
    for spec in specs:
        kwargs = dict(spec.kwargs)
        parallel = spec.parallel
        if spec.model_path:
            from grpo_cli.rewards.reward_model import RewardModelScorer  # torch only when a model is configured

            fn: Callable[..., Any] = RewardModelScorer(spec.model_path, spec.device or device, spec.batch_size)
            default_normalize = "zscore"
            parallel = False  # a model stays in the process that loaded it (and owns the GPU)
        else:
            fn = _import_target(spec.target)
            calling = calling_convention(fn, spec.calling)
            _check_signature(spec.name, fn, calling)
            if calling == "trl":
                fn = TrlStyleReward(fn, chat, trainer_state)
            if getattr(fn, "takes_sandbox_settings", False):
                kwargs = {**(dataclasses.asdict(sandbox) if sandbox is not None else {}), **kwargs}
            default_normalize = "none"
            if parallel:
                _check_picklable(spec.name, fn, kwargs)
        sources.append(
            RewardSource(
                name=spec.name,
                fn=fn,
                weight=float(spec.weight),
                normalize=spec.normalize or default_normalize,
                fallback=spec.fallback,
                kwargs=kwargs,
                timeout_s=None if spec.timeout_s is None else float(spec.timeout_s),
                parallel=parallel,
                ema_momentum=None if spec.ema_momentum is None else float(spec.ema_momentum),
                on_row_error=spec.on_row_error,
            )
        )
    return sources


def names_completion_ids(fn: Callable[..., Any]) -> bool:
    """Whether `fn` has a parameter named `completion_ids` (a TRL-style function always has)."""
    try:
        return COMPLETION_IDS in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def uses_completion_lengths(sources: list[RewardSource]) -> list[str]:
    """Names of the sources that read `completion_lengths` (a parameter of that name)."""
    names = []
    for source in sources:
        try:
            params = inspect.signature(source.fn).parameters
        except (TypeError, ValueError):
            continue
        if "completion_lengths" in params:
            names.append(source.name)
    return names


def reward_diagnostics(sources: list[RewardSource]) -> dict[str, Any]:
    """Facts a reward reports about itself at start-up (e.g. the sandbox backend in use).

    A reward opts in with a `diagnostics(**kwargs) -> dict` attribute; a failure here means the
    reward cannot work at all, so it stops the run before any model loads.
    """
    facts: dict[str, Any] = {}
    for source in sources:
        hook = getattr(source.fn, "diagnostics", None)
        if hook is None:
            continue
        try:
            facts.update(hook(**source.kwargs))
        except Exception as err:  # HarnessFault and friends: say which reward and why
            raise GrpoError(f"reward '{source.name}' cannot start: {err}") from None
    return facts
