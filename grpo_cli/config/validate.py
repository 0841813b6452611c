"""Checks that must fail before any model is built, and the smoke-mode shrink.

Type errors are caught by OmegaConf against the schema; this module catches what types cannot
say (ranges, enumerations, paths) and unknown keys, with the nearest valid key suggested.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path

from grpo_cli.config.schema import (
    CONSOLES,
    CURRICULA,
    INTERPOLATIONS,
    LAYOUTS,
    LONG_PROMPT_POLICIES,
    LR_SCALINGS,
    NORMALIZATIONS,
    ROLLOUT_BACKENDS,
    ROLLOUT_LOOPS,
    SPLITS,
    TRACKERS,
    DataConfig,
    EvalConfig,
    ModelConfig,
    RolloutConfig,
    RolloutRunConfig,
    TrainConfig,
)
from grpo_cli.errors import GrpoError

CHOICES = {
    "model.kind": ("tiny", "hf"),
    "model.dtype": ("auto", "fp32", "bf16", "fp16"),
    "data.kind": ("arithmetic", "jsonl", "math", "code"),
    "data.on_long_prompt": LONG_PROMPT_POLICIES,
    "precision.dtype": ("fp32", "bf16", "fp16"),
    "guard.action": ("warn", "pause", "stop"),
    "algo.loss_type": ("grpo", "bnpo", "dr_grpo", "dapo"),
    "algo.scale_rewards": ("group", "batch", "none"),
    "algo.ratio_level": ("token", "sequence"),
    "algo.kl_estimator": ("k1", "k2", "k3"),
    "optim.scheduler": ("constant", "cosine", "linear"),
    "optim.lr_scaling": LR_SCALINGS,
    "rollout.backend": ROLLOUT_BACKENDS,
    "rollout.loop": ROLLOUT_LOOPS,
    "train.layout": LAYOUTS,
    "curriculum.name": CURRICULA,
    "curriculum.interpolate": INTERPOLATIONS,
    "reward.aggregation": ("weighted_mean", "normalize_then_sum"),
    "sandbox.backend": ("auto", "bwrap", "unshare", "process"),
    "monitor.console": CONSOLES,
}


FREE_FORM = typing.Any  # e.g. reward.functions.N.kwargs.*: the function's own keyword arguments


def _unwrap(hint: typing.Any) -> typing.Any:
    """`X | None` -> X; anything else unchanged."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def child_hint(hint: typing.Any, part: str) -> typing.Any:
    """The type below `part` in a node of type `hint`, FREE_FORM where anything goes, or None
    when `part` cannot follow: the one step of the walk shared with tests/config."""
    hint = _unwrap(hint)
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
        hint = _unwrap(hint)
        item = typing.get_args(hint)[0] if typing.get_origin(hint) is list else None
        if dataclasses.is_dataclass(hint):
            keys.extend(leaf_keys(hint, key + "."))
        elif item is not None and dataclasses.is_dataclass(_unwrap(item)):
            keys.extend(leaf_keys(_unwrap(item), key + "[]."))
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
        hint = _unwrap(hints[f.name])
        if dataclasses.is_dataclass(hint):
            keys.extend(_dotted_fields(hint, key + "."))
    return keys


def _nearest(parts: list[str], i: int, hint: typing.Any, schema: type) -> str | None:
    """The valid key nearest to `parts`, which is valid up to `parts[i]`."""
    prefix, rest = parts[:i], parts[i + 1 :]
    hint = _unwrap(hint)
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
            parent, node = ".".join(parts[:i]), _unwrap(hint)
            if i and typing.get_origin(node) not in (list, dict) and not dataclasses.is_dataclass(node):
                raise GrpoError(f"unknown config key {key}: {parent} is a value, not a section")
            close = _nearest(parts, i, hint, schema)
            suffix = f"; did you mean {close}?" if close else ""
            if typing.get_origin(node) is list:
                suffix = f" ({parent} takes a list index){suffix}"
            raise GrpoError(f"unknown config key {key}{suffix}")
        hint = below


def flatten(node: typing.Any, prefix: str = "") -> dict[str, typing.Any]:
    """A plain config tree (dicts, lists) as {dotted key: value}; lists of mappings get index keys.

    >>> flatten({"optim": {"lr": 0.1, "betas": [0.9, 0.99]}, "reward": {"functions": [{"name": "a"}]}})
    {'optim.lr': 0.1, 'optim.betas': [0.9, 0.99], 'reward.functions.0.name': 'a'}
    """
    if isinstance(node, dict):
        out: dict[str, typing.Any] = {}
        for key, value in node.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    if isinstance(node, (list, tuple)) and any(isinstance(v, (dict, list)) for v in node):
        out = {}
        for i, value in enumerate(node):
            out.update(flatten(value, f"{prefix}{i}."))
        return out
    return {prefix[:-1]: list(node) if isinstance(node, tuple) else node}


def _fail(key: str, value: object, why: str) -> None:
    raise GrpoError(f"invalid value {key}={value!r}: {why}")


def _check_choice(key: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        close = difflib.get_close_matches(str(value), allowed, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        _fail(key, value, f"must be one of {', '.join(allowed)}{hint}")


def _check_adaptive_clip(cfg: TrainConfig) -> None:
    """algo.adaptive_clip: checked even while disabled, so enabling it later cannot surprise."""
    clip = cfg.algo.adaptive_clip
    for name in ("base", "min", "max"):
        if getattr(clip, name) <= 0:
            _fail(f"algo.adaptive_clip.{name}", getattr(clip, name), "must be > 0")
    if clip.max >= 1:
        _fail("algo.adaptive_clip.max", clip.max, "must be < 1 (the ratio is clipped at 1 - epsilon)")
    if clip.min > clip.base:
        _fail("algo.adaptive_clip.min", clip.min, f"must be <= algo.adaptive_clip.base ({clip.base})")
    if clip.base > clip.max:
        _fail("algo.adaptive_clip.base", clip.base, f"must be <= algo.adaptive_clip.max ({clip.max})")
    if clip.window < 2:
        _fail("algo.adaptive_clip.window", clip.window, "must be at least 2 (a std needs two batch means)")
    if clip.alpha < 0:
        _fail("algo.adaptive_clip.alpha", clip.alpha, "must be >= 0 (0: always base)")


def _check_lora(model: ModelConfig) -> None:
    """model.lora: checked even while disabled, so enabling it later cannot surprise."""
    lora = model.lora
    if lora.r < 1:
        _fail("model.lora.r", lora.r, "must be at least 1")
    if lora.alpha <= 0:
        _fail("model.lora.alpha", lora.alpha, "must be > 0 (the update is scaled by alpha / r)")
    if not 0 <= lora.dropout < 1:
        _fail("model.lora.dropout", lora.dropout, "must be in [0, 1)")
    if not lora.target_modules or not all(isinstance(m, str) and m for m in lora.target_modules):
        _fail(
            "model.lora.target_modules",
            list(lora.target_modules),
            "must name at least one module, e.g. [q_proj, k_proj, v_proj, o_proj]",
        )


def validate_generation(model: ModelConfig, data: DataConfig, rollout: RolloutConfig) -> None:
    """The checks of every command that samples from a model on a data set (train, rollout)."""
    choices = {
        "model.kind": model.kind,
        "model.dtype": model.dtype,
        "data.kind": data.kind,
        "data.on_long_prompt": data.on_long_prompt,
        "rollout.backend": rollout.backend,
        "rollout.loop": rollout.loop,
    }
    for key, value in choices.items():
        _check_choice(key, value, CHOICES[key])
    if rollout.max_new_tokens < 1:
        _fail("rollout.max_new_tokens", rollout.max_new_tokens, "must be at least 1")
    if not 0 <= rollout.min_new_tokens <= rollout.max_new_tokens:
        _fail(
            "rollout.min_new_tokens",
            rollout.min_new_tokens,
            f"must be in [0, rollout.max_new_tokens={rollout.max_new_tokens}]",
        )
    if rollout.temperature <= 0:
        _fail("rollout.temperature", rollout.temperature, "must be > 0")
    if not 0 < rollout.top_p <= 1:
        _fail("rollout.top_p", rollout.top_p, "must be in (0, 1]")
    if rollout.top_k < 0:
        _fail("rollout.top_k", rollout.top_k, "must be >= 0 (0 disables top-k)")
    if not 0 < data.fraction <= 1:
        _fail("data.fraction", data.fraction, "must be in (0, 1]")
    if not 0 <= data.eval_fraction < 1:
        _fail("data.eval_fraction", data.eval_fraction, "must be in [0, 1)")
    if model.kind == "tiny" and model.tiny.hidden_size % model.tiny.num_heads:  # attention splits the width
        _fail(
            "model.tiny.hidden_size",
            model.tiny.hidden_size,
            f"must be a multiple of model.tiny.num_heads={model.tiny.num_heads}",
        )
    if model.kind == "hf" and (model.path or not model.package):  # model.path wins over model.package
        if not model.path:
            raise GrpoError("model=hf needs model.path=DIR (a local Hugging Face model directory or a .gguf file)")
        if not (Path(model.path).is_dir() or (model.path.lower().endswith(".gguf") and Path(model.path).is_file())):
            raise GrpoError(f"model.path={model.path}: no such directory (nor a .gguf file)")
    if data.kind == "jsonl":
        if not data.path:
            raise GrpoError("data=jsonl needs data.path=FILE")
        if not Path(data.path).is_file():
            raise GrpoError(f"data.path={data.path}: no such file")


def validate_rollout(cfg: RolloutRunConfig) -> None:
    """`grpo rollout`: one group of one is a valid rollouts file (eval-style sampling), so G >= 1."""
    validate_generation(cfg.model, cfg.data, cfg.rollout)
    _check_choice("split", cfg.split, SPLITS)
    _check_choice("console", cfg.console, CONSOLES)
    for key, value in {"rollout.num_generations": cfg.rollout.num_generations, "batch_size": cfg.batch_size}.items():
        if value < 1:
            _fail(key, value, "must be at least 1")
    if cfg.max_prompts < 0:
        _fail("max_prompts", cfg.max_prompts, "must be >= 0 (0: every prompt of the split)")
    if cfg.threads < 0:
        _fail("threads", cfg.threads, "must be >= 0 (0: auto)")
    if cfg.split == "eval" and cfg.data.eval_fraction == 0:
        raise GrpoError("split=eval selects nothing with data.eval_fraction=0: set data.eval_fraction > 0")


def validate_eval(cfg: EvalConfig) -> None:
    """`grpo eval`: a rollouts file (input=) needs no model or data set, so those are checked only
    when it generates; pass@k needs k <= n, checked here for n = rollout.num_generations and
    against the file's group size once it is read."""
    if cfg.input is None:
        validate_generation(cfg.model, cfg.data, cfg.rollout)
        _check_choice("split", cfg.split, SPLITS)
        _check_choice("precision.dtype", cfg.precision.dtype, CHOICES["precision.dtype"])
        if cfg.split == "eval" and cfg.data.eval_fraction == 0:
            raise GrpoError("split=eval selects nothing with data.eval_fraction=0: set data.eval_fraction > 0")
    for key, value in {"rollout.num_generations": cfg.rollout.num_generations, "batch_size": cfg.batch_size}.items():
        if value < 1:
            _fail(key, value, "must be at least 1")
    if cfg.max_prompts < 0:
        _fail("max_prompts", cfg.max_prompts, "must be >= 0 (0: every prompt)")
    if not cfg.reward.functions:
        raise GrpoError("reward.functions is empty: choose a reward, e.g. reward=arithmetic")
    if any(k < 1 for k in cfg.eval.k):
        _fail("eval.k", list(cfg.eval.k), "every k must be at least 1")
    n = cfg.rollout.num_generations
    if cfg.input is None and any(k > n for k in cfg.eval.k):
        _fail("eval.k", list(cfg.eval.k), f"pass@k needs k <= rollout.num_generations={n} completions per prompt")


def validate(cfg: TrainConfig) -> list[str]:
    """Reject impossible values; return warnings for legal but doubtful ones."""
    for key, allowed in CHOICES.items():
        section, name = key.split(".")
        _check_choice(key, getattr(getattr(cfg, section), name), allowed)
    if cfg.precision.dtype == "fp16" and cfg.precision.autocast and not cfg.precision.grad_scaler:
        raise GrpoError(
            "precision.dtype=fp16 with precision.autocast=true needs precision.grad_scaler=true: without a "
            "gradient scaler fp16 gradients underflow to zero. Use precision=fp16 (which sets it) or precision=bf16"
        )
    if cfg.guard.reward_cv_threshold <= 0:
        _fail("guard.reward_cv_threshold", cfg.guard.reward_cv_threshold, "must be > 0")
    if cfg.guard.min_abs_mean < 0:
        _fail("guard.min_abs_mean", cfg.guard.min_abs_mean, "must be >= 0")
    positive_ints = {
        "train.steps": cfg.train.steps,
        "train.prompts_per_step": cfg.train.prompts_per_step,
        "train.grad_accum_steps": cfg.train.grad_accum_steps,
        "algo.num_iterations": cfg.algo.num_iterations,
        "algo.mini_batches": cfg.algo.mini_batches,
        "guard.patience": cfg.guard.patience,
        "guard.max_skipped_steps": cfg.guard.max_skipped_steps,
        "sandbox.workers": cfg.sandbox.workers,
        "reward.max_consecutive_failures": cfg.reward.max_consecutive_failures,
        "monitor.print_every": cfg.monitor.print_every,
        "distributed.num_processes": cfg.distributed.num_processes,
    }
    for key, value in positive_ints.items():
        if value < 1:
            _fail(key, value, "must be at least 1")
    if not 0 <= cfg.distributed.main_process_port <= 65535:
        _fail("distributed.main_process_port", cfg.distributed.main_process_port, "must be a port, 0 for a free one")
    if cfg.distributed.accelerate_config and not Path(cfg.distributed.accelerate_config).is_file():
        _fail("distributed.accelerate_config", cfg.distributed.accelerate_config, "is not a file")
    g = cfg.rollout.num_generations
    if g < 2:
        _fail("rollout.num_generations", g, "group-relative advantages need at least 2 per prompt")
    if cfg.optim.lr <= 0:
        _fail("optim.lr", cfg.optim.lr, "must be > 0")
    for key in ("epsilon_low", "epsilon_high"):
        if getattr(cfg.algo, key) <= 0:
            _fail(f"algo.{key}", getattr(cfg.algo, key), "must be > 0")
    if cfg.algo.epsilon_low >= 1:
        _fail("algo.epsilon_low", cfg.algo.epsilon_low, "must be < 1 (the ratio is clipped at 1 - epsilon_low)")
    if cfg.algo.beta < 0:
        _fail("algo.beta", cfg.algo.beta, "must be >= 0")
    validate_generation(cfg.model, cfg.data, cfg.rollout)
    if cfg.optim.max_grad_norm < 0:
        _fail("optim.max_grad_norm", cfg.optim.max_grad_norm, "must be >= 0 (0 disables clipping)")
    if len(cfg.optim.betas) != 2 or not all(0 <= b < 1 for b in cfg.optim.betas):
        _fail("optim.betas", list(cfg.optim.betas), "must be two numbers in [0, 1)")
    if cfg.optim.reference_batch < 0 or (cfg.optim.lr_scaling != "none" and cfg.optim.reference_batch == 0):
        _fail(
            "optim.reference_batch",
            cfg.optim.reference_batch,
            f"optim.lr_scaling={cfg.optim.lr_scaling} needs the completions per optimizer step optim.lr was "
            "tuned for (> 0), e.g. train.prompts_per_step·rollout.num_generations/algo.mini_batches of that run",
        )
    _check_adaptive_clip(cfg)
    _check_lora(cfg.model)
    # Each process splits its own share of the groups: 4 prompts over 2 processes leave 2 per process
    # (a share that does not divide evenly is refused by training.distributed.check_divisible).
    processes = cfg.distributed.num_processes
    share = cfg.train.prompts_per_step // processes if cfg.train.prompts_per_step % processes == 0 else None
    if share is not None and cfg.algo.mini_batches > share:
        per_process = "" if processes == 1 else f" / distributed.num_processes={processes} = {share} per process"
        _fail(
            "algo.mini_batches",
            cfg.algo.mini_batches,
            f"cannot exceed the prompts each process holds per step (train.prompts_per_step="
            f"{cfg.train.prompts_per_step}{per_process}): mini-batches hold whole groups",
        )
    for i, tracker in enumerate(cfg.monitor.trackers):
        _check_choice(f"monitor.trackers[{i}]", tracker, TRACKERS)
    for key in ("repetition_alert", "nan_alert"):
        if not 0 <= getattr(cfg.monitor, key) <= 1:
            _fail(f"monitor.{key}", getattr(cfg.monitor, key), "must be in [0, 1] (0: off)")
    if cfg.monitor.hacking_alert < 0:
        _fail("monitor.hacking_alert", cfg.monitor.hacking_alert, "must be >= 0, in reward units (0: off)")
    if cfg.monitor.hacking_window < 1:
        _fail("monitor.hacking_window", cfg.monitor.hacking_window, "must be >= 1 (steps)")
    for key in ("log_completions_every", "num_completions_to_print"):
        if getattr(cfg.monitor, key) < 0:
            _fail(f"monitor.{key}", getattr(cfg.monitor, key), "must be >= 0 (0: never)")
    if cfg.sandbox.timeout_s <= 0:
        _fail("sandbox.timeout_s", cfg.sandbox.timeout_s, "must be > 0")
    if cfg.sandbox.memory_mb < 32:
        _fail("sandbox.memory_mb", cfg.sandbox.memory_mb, "must be at least 32 (the interpreter alone needs ~10)")
    if cfg.reward.num_workers < 0:
        _fail("reward.num_workers", cfg.reward.num_workers, "must be >= 0 (0 scores in the trainer's process)")
    if not cfg.reward.functions:
        raise GrpoError("reward.functions is empty: choose a reward, e.g. reward=arithmetic")
    for i, fn in enumerate(cfg.reward.functions):
        if fn.weight < 0:
            _fail(f"reward.functions[{i}].weight", fn.weight, "must be >= 0")
        if fn.normalize is not None:
            _check_choice(f"reward.functions[{i}].normalize", fn.normalize, NORMALIZATIONS)
        if fn.ema_momentum is not None and not 0 <= fn.ema_momentum < 1:
            _fail(f"reward.functions[{i}].ema_momentum", fn.ema_momentum, "must be in [0, 1) (null: the default)")
    if not 0 <= cfg.reward.ema_momentum < 1:
        _fail("reward.ema_momentum", cfg.reward.ema_momentum, "must be in [0, 1); 0.9-0.99 typical")
    warnings = []
    if not 4 <= g <= 64:
        warnings.append(
            f"rollout.num_generations={g}: groups under 4 give an unreliable std, over 64 make "
            "rollouts dominate the step"
        )
    clip = cfg.algo.adaptive_clip
    if clip.enabled and not 0.5 <= clip.base / cfg.algo.epsilon_low <= 2:
        warnings.append(
            f"algo.adaptive_clip.base={clip.base} replaces algo.epsilon_low={cfg.algo.epsilon_low} while "
            "adaptive clipping is on: set base (and min, max) to this preset's scale"
        )
    return warnings


def apply_smoke(cfg: TrainConfig) -> None:
    """Shrink any composed config to seconds of work, keeping its data, rewards and algorithm.

    Done in code rather than YAML so it wins over whatever a recipe sets, in any merge order.
    """
    d = cfg.debug
    cfg.model.kind = "tiny"
    cfg.model.path = None
    cfg.model.gguf_file = None
    cfg.model.package = None
    cfg.model.dtype = "auto"
    cfg.precision.dtype = "fp32"
    cfg.precision.autocast = False
    cfg.train.steps = d.steps
    cfg.monitor.plots = False  # two steps draw no curve; the pictures would cost more than the run
    cfg.train.prompts_per_step = d.prompts_per_step
    cfg.train.grad_accum_steps = 1
    cfg.train.save_every = 0
    cfg.train.eval_every = 0
    cfg.train.device = "cpu"
    cfg.rollout.num_generations = d.num_generations
    cfg.rollout.max_new_tokens = d.max_new_tokens
    cfg.data.max_examples = d.max_examples
    cfg.data.max_prompt_tokens = min(cfg.data.max_prompt_tokens, 128)
    cfg.algo.mini_batches = min(cfg.algo.mini_batches, max(1, d.prompts_per_step // cfg.distributed.num_processes))
