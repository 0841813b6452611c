"""Checks that must fail before any model is built, and the smoke-mode shrink.

Type errors are caught by OmegaConf against the schema; this module catches what types cannot
say (ranges, enumerations, paths) and unknown keys, with the nearest valid key suggested.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from pathlib import Path

from grpo_cli.config.schema import TrainConfig
from grpo_cli.errors import GrpoError

CHOICES = {
    "model.kind": ("tiny", "hf"),
    "model.dtype": ("auto", "fp32", "bf16", "fp16"),
    "data.kind": ("arithmetic", "jsonl", "math", "code"),
    "precision.dtype": ("fp32", "bf16", "fp16"),
    "algo.loss_type": ("grpo", "bnpo", "dr_grpo", "dapo"),
    "algo.scale_rewards": ("group", "batch", "none"),
    "algo.ratio_level": ("token", "sequence"),
    "algo.kl_estimator": ("k1", "k2", "k3"),
    "optim.scheduler": ("constant", "cosine", "linear"),
    "rollout.backend": ("hf",),
    "curriculum.name": ("constant",),
    "reward.aggregation": ("weighted_mean", "normalize_then_sum"),
    "sandbox.backend": ("auto", "bwrap", "unshare", "process"),
}


def _leaf_paths(schema: type, prefix: str = "") -> dict[str, typing.Any]:
    """Every valid dotted key of a dataclass schema, mapped to its annotated type."""
    paths: dict[str, typing.Any] = {}
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        key = f"{prefix}{f.name}"
        hint = hints[f.name]
        paths[key] = hint
        if dataclasses.is_dataclass(hint):
            paths.update(_leaf_paths(hint, key + "."))
    return paths


def check_key(key: str, schema: type = TrainConfig) -> None:
    """Raise a GrpoError naming `key` and the nearest valid key when the schema lacks it.

    Keys below a dict- or list-typed field (reward kwargs, curriculum weights) are free-form.
    """
    paths = _leaf_paths(schema)
    if key in paths:
        return
    parts = key.split(".")
    for i in range(1, len(parts)):
        hint = paths.get(".".join(parts[:i]))
        if hint is not None and typing.get_origin(hint) in (dict, list):
            return
    parent = ".".join(parts[:-1])
    siblings = [p for p in paths if (p.rsplit(".", 1)[0] if "." in p else "") == parent]
    ancestors = {".".join(parts[:i]) for i in range(1, len(parts))}
    candidates = [p for p in paths if p not in ancestors]
    close = difflib.get_close_matches(key, siblings, n=1, cutoff=0.6) or difflib.get_close_matches(
        key, candidates, n=1, cutoff=0.6
    )
    hint = f"; did you mean {close[0]}?" if close else ""
    raise GrpoError(f"unknown config key {key}{hint}")


def _fail(key: str, value: object, why: str) -> None:
    raise GrpoError(f"invalid value {key}={value!r}: {why}")


def validate(cfg: TrainConfig) -> list[str]:
    """Reject impossible values; return warnings for legal but doubtful ones."""
    for key, allowed in CHOICES.items():
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if value not in allowed:
            close = difflib.get_close_matches(str(value), allowed, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            _fail(key, value, f"must be one of {', '.join(allowed)}{hint}")
    positive_ints = {
        "train.steps": cfg.train.steps,
        "train.prompts_per_step": cfg.train.prompts_per_step,
        "train.grad_accum_steps": cfg.train.grad_accum_steps,
        "rollout.max_new_tokens": cfg.rollout.max_new_tokens,
        "algo.num_iterations": cfg.algo.num_iterations,
        "algo.mini_batches": cfg.algo.mini_batches,
    }
    for key, value in positive_ints.items():
        if value < 1:
            _fail(key, value, "must be at least 1")
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
    if cfg.rollout.temperature <= 0:
        _fail("rollout.temperature", cfg.rollout.temperature, "must be > 0")
    if not 0 < cfg.rollout.top_p <= 1:
        _fail("rollout.top_p", cfg.rollout.top_p, "must be in (0, 1]")
    if cfg.rollout.top_k < 0:
        _fail("rollout.top_k", cfg.rollout.top_k, "must be >= 0 (0 disables top-k)")
    if not 0 < cfg.data.fraction <= 1:
        _fail("data.fraction", cfg.data.fraction, "must be in (0, 1]")
    if not 0 <= cfg.data.eval_fraction < 1:
        _fail("data.eval_fraction", cfg.data.eval_fraction, "must be in [0, 1)")
    if cfg.optim.max_grad_norm < 0:
        _fail("optim.max_grad_norm", cfg.optim.max_grad_norm, "must be >= 0 (0 disables clipping)")
    if len(cfg.optim.betas) != 2 or not all(0 <= b < 1 for b in cfg.optim.betas):
        _fail("optim.betas", list(cfg.optim.betas), "must be two numbers in [0, 1)")
    if cfg.algo.mini_batches > cfg.train.prompts_per_step:
        _fail(
            "algo.mini_batches",
            cfg.algo.mini_batches,
            "cannot exceed train.prompts_per_step (mini-batches hold whole groups)",
        )
    if cfg.sandbox.timeout_s <= 0:
        _fail("sandbox.timeout_s", cfg.sandbox.timeout_s, "must be > 0")
    if cfg.sandbox.memory_mb < 32:
        _fail("sandbox.memory_mb", cfg.sandbox.memory_mb, "must be at least 32 (the interpreter alone needs ~10)")
    if cfg.sandbox.workers < 1:
        _fail("sandbox.workers", cfg.sandbox.workers, "must be at least 1")
    if cfg.reward.max_consecutive_failures < 1:
        _fail("reward.max_consecutive_failures", cfg.reward.max_consecutive_failures, "must be at least 1")
    if cfg.reward.num_workers < 0:
        _fail("reward.num_workers", cfg.reward.num_workers, "must be >= 0 (0 scores in the trainer's process)")
    if not cfg.reward.functions:
        raise GrpoError("reward.functions is empty: choose a reward, e.g. reward=arithmetic")
    for i, fn in enumerate(cfg.reward.functions):
        if fn.weight < 0:
            _fail(f"reward.functions[{i}].weight", fn.weight, "must be >= 0")
    if cfg.model.kind == "hf":
        if not cfg.model.path:
            raise GrpoError("model=hf needs model.path=DIR (a local Hugging Face model directory)")
        if not Path(cfg.model.path).is_dir():
            raise GrpoError(f"model.path={cfg.model.path}: no such directory")
    if cfg.data.kind == "jsonl":
        if not cfg.data.path:
            raise GrpoError("data=jsonl needs data.path=FILE")
        if not Path(cfg.data.path).is_file():
            raise GrpoError(f"data.path={cfg.data.path}: no such file")
    warnings = []
    if not 4 <= g <= 64:
        warnings.append(
            f"rollout.num_generations={g}: groups under 4 give an unreliable std, over 64 make "
            "rollouts dominate the step"
        )
    return warnings


def apply_smoke(cfg: TrainConfig) -> None:
    """Shrink any composed config to seconds of work, keeping its data, rewards and algorithm.

    Done in code rather than YAML so it wins over whatever a recipe sets, in any merge order.
    """
    d = cfg.debug
    cfg.model.kind = "tiny"
    cfg.model.path = None
    cfg.model.dtype = "auto"
    cfg.precision.dtype = "fp32"
    cfg.precision.autocast = False
    cfg.train.steps = d.steps
    cfg.train.prompts_per_step = d.prompts_per_step
    cfg.train.grad_accum_steps = 1
    cfg.train.save_every = 0
    cfg.train.eval_every = 0
    cfg.train.device = "cpu"
    cfg.rollout.num_generations = d.num_generations
    cfg.rollout.max_new_tokens = d.max_new_tokens
    cfg.data.max_examples = d.max_examples
    cfg.data.max_prompt_tokens = min(cfg.data.max_prompt_tokens, 128)
    cfg.algo.mini_batches = min(cfg.algo.mini_batches, d.prompts_per_step)
