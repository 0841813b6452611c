"""The value conversions of the TRL mapping (grpo_cli/config/trl/mapping.py) that are more than a
rename: TRL counts its batch in completions per device and its run in optimizer steps, where grpo
counts prompts per step and rollout steps; schedules, precision and trackers are spelled otherwise.

Each converter takes the field's value and `get`, which reads any other field (the file's value,
else TRL's default), because several TRL fields only mean something together (the batch is four of
them). It returns an `Outcome`: the grpo overrides, and what of the value it could not express.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from grpo_cli.config.schema import TRACKERS

Lookup = Callable[[str], Any]  # a TRL field's value: the file's, else TRL's default


class BadTrlValue(ValueError):
    """A value grpo cannot run as TRL would; the CLI adds the file and the field to the message."""


@dataclass(frozen=True)
class Outcome:
    """What one TRL field becomes: grpo overrides (dotted key or group -> value), and, when part of
    the value has no equivalent, why (printed, one line per field)."""

    overrides: dict[str, Any] = field(default_factory=dict)
    left_out: str = ""


Converter = Callable[[Any, Lookup], Outcome]


def number(value: Any, kind: type = float) -> Any:
    """A YAML 1.1 loader reads `1e-6` as a string; TRL's argument parser would take it as a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise BadTrlValue(f"expected a number, got {value!r}")
    try:
        parsed = float(value)
    except ValueError:
        raise BadTrlValue(f"expected a number, got {value!r}") from None
    if kind is int:
        if parsed != int(parsed):
            raise BadTrlValue(f"expected a whole number, got {value!r}")
        return int(parsed)
    return parsed


def flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise BadTrlValue(f"expected true or false, got {value!r}")
    return value


def batch(get: Lookup) -> dict[str, Any]:
    """TRL's batch fields as grpo's, for one process. TRL samples generation_batch_size completions
    (default per_device_train_batch_size x steps_per_generation, which defaults to the accumulation
    steps) and spends them in steps_per_generation micro-batches, gradient_accumulation_steps to an
    optimizer step: grpo's prompts per step, mini-batches (optimizer steps per pass) and
    micro-batches per mini-batch.

    >>> defaults = {"per_device_train_batch_size": 16, "gradient_accumulation_steps": 2,
    ...             "num_generations": 8, "generation_batch_size": None, "steps_per_generation": 4}
    >>> batch(defaults.get)
    {'train.prompts_per_step': 8, 'train.grad_accum_steps': 2, 'algo.mini_batches': 2}
    """
    per_device = number(get("per_device_train_batch_size"), int)
    accumulation = number(get("gradient_accumulation_steps"), int)
    group = number(get("num_generations"), int)
    generation, steps = get("generation_batch_size"), get("steps_per_generation")
    if generation is not None and steps is not None:
        raise BadTrlValue("generation_batch_size and steps_per_generation exclude each other (as in TRL)")
    if generation is None:
        steps = accumulation if steps is None else number(steps, int)
        generation = per_device * steps
    else:
        generation = number(generation, int)
        if generation % per_device:
            raise BadTrlValue(f"generation_batch_size {generation} is no multiple of per_device_train_batch_size")
        steps = generation // per_device
    if generation % group:
        raise BadTrlValue(f"{generation} completions per generation are no whole groups of num_generations={group}")
    if steps % accumulation:
        raise BadTrlValue(
            f"steps_per_generation {steps} is no multiple of gradient_accumulation_steps {accumulation}: "
            "grpo's optimizer steps take whole mini-batches"
        )
    return {
        "train.prompts_per_step": generation // group,
        "train.grad_accum_steps": accumulation,
        "algo.mini_batches": steps // accumulation,
    }


def batch_field(value: Any, get: Lookup) -> Outcome:
    """Any one of the batch fields: the whole batch, so each agrees with the others."""
    return Outcome(batch(get))


def num_generations(value: Any, get: Lookup) -> Outcome:
    return Outcome({"rollout.num_generations": number(value, int), **batch(get)})


def updates_per_step(get: Lookup) -> int:
    """Optimizer steps per grpo step (one generation): TRL's max_steps counts these."""
    return number(get("num_iterations"), int) * batch(get)["algo.mini_batches"]


def steps_or_ratio(value: Any, get: Lookup, name: str) -> int:
    """transformers' step counts: a whole number, or below 1 a share of max_steps (rounded up, as it does)."""
    value = number(value)
    if value >= 1 or value == 0:
        return number(value, int)
    total = number(get("max_steps"), int)
    if total < 1:
        raise BadTrlValue(f"{name}={value} is a share of max_steps, which the file leaves at -1 (epochs)")
    return math.ceil(value * total)


def interval(value: Any, get: Lookup, name: str) -> int:
    """A Trainer interval (save_steps, eval_steps, logging_steps, ...) in grpo steps. transformers
    counts it in optimizer steps, as max_steps, so it is divided by the same updates per step, or
    TRL's 5 checkpoints would become 1. Rounded down (at least 1): never fewer events than TRL's.

    >>> interval(20, {"num_iterations": 1, "per_device_train_batch_size": 8, "num_generations": 8,
    ...               "gradient_accumulation_steps": 1, "generation_batch_size": None,
    ...               "steps_per_generation": 4}.get, "save_steps")
    5
    """
    steps = steps_or_ratio(value, get, name)
    return max(1, steps // updates_per_step(get)) if steps else 0


def max_steps(value: Any, get: Lookup) -> Outcome:
    steps = number(value, int)
    if steps < 1:
        return Outcome(left_out="-1 counts epochs; grpo counts steps: set train.steps")
    return Outcome({"train.steps": math.ceil(steps / updates_per_step(get))})


# transformers' schedule names -> grpo's optim.scheduler; TRL's "constant" has no warm-up, ours has
SCHEDULES = {"constant": "constant", "constant_with_warmup": "constant", "linear": "linear", "cosine": "cosine"}


def lr_scheduler_type(value: Any, get: Lookup) -> Outcome:
    if value not in SCHEDULES:
        raise BadTrlValue(f"grpo's schedules are {', '.join(SCHEDULES)}")
    overrides: dict[str, Any] = {"optim.scheduler": SCHEDULES[value]}
    if value == "constant":
        overrides["optim.warmup_steps"] = 0
    return Outcome(overrides)


def warmup(value: Any, get: Lookup, name: str) -> Outcome:
    steps = steps_or_ratio(value, get, name)
    if get("lr_scheduler_type") == "constant" and steps:
        return Outcome(left_out="TRL's constant schedule has no warm-up (constant_with_warmup has); not applied")
    return Outcome({"optim.warmup_steps": steps})


def warmup_ratio(value: Any, get: Lookup) -> Outcome:
    """transformers 4's share of max_steps (5 folded it into warmup_steps below 1)."""
    ratio = number(value)
    if not ratio:
        return Outcome({"optim.warmup_steps": 0})
    total = number(get("max_steps"), int)
    if total < 1:
        raise BadTrlValue("a share of max_steps, which the file leaves at -1 (epochs)")
    return warmup(math.ceil(ratio * total), get, "warmup_ratio")


def adam_betas(value: Any, get: Lookup) -> Outcome:
    return Outcome({"optim.betas": [number(get("adam_beta1")), number(get("adam_beta2"))]})


def bf16(value: Any, get: Lookup) -> Outcome:
    """TRL's None means bf16 unless fp16 is set."""
    if value is None or flag(value):
        return Outcome() if flag(get("fp16")) and value is None else Outcome({"precision": "bf16"})
    return Outcome() if flag(get("fp16")) else Outcome({"precision": "fp32"})


def fp16(value: Any, get: Lookup) -> Outcome:
    return Outcome({"precision": "fp16"}) if flag(value) else Outcome()


def report_to(value: Any, get: Lookup) -> Outcome:
    names = [value] if isinstance(value, str) or value is None else list(value)
    if names in ([None], ["none"], []):
        return Outcome({"monitor.trackers": []})
    unknown = [name for name in names if name not in TRACKERS]
    if unknown:
        raise BadTrlValue(f"grpo's trackers are {', '.join(TRACKERS)} (name them; 'all' is not one)")
    return Outcome({"monitor.trackers": names})


def save_strategy(value: Any, get: Lookup) -> Outcome:
    if value in ("no", False):  # False: YAML 1.1 reads a bare `no` as a boolean
        return Outcome({"train.save_every": 0}, "grpo still writes the final checkpoint")
    if value != "steps":
        raise BadTrlValue("grpo saves every train.save_every steps: use steps (or no)")
    return Outcome({"train.save_every": interval(get("save_steps"), get, "save_steps")})


def save_steps(value: Any, get: Lookup) -> Outcome:
    if get("save_strategy") != "steps":  # transformers ignores it then
        return Outcome(left_out=f"unused while save_strategy is {get('save_strategy')}")
    return Outcome({"train.save_every": interval(value, get, "save_steps")})


def eval_strategy(value: Any, get: Lookup) -> Outcome:
    if value in ("no", False):
        return Outcome({"train.eval_every": 0})
    if value != "steps":
        raise BadTrlValue("grpo evaluates every train.eval_every steps: use steps (or no)")
    every = get("eval_steps")
    every = get("logging_steps") if every is None else every  # transformers' rule for an unset eval_steps
    return Outcome({"train.eval_every": interval(every, get, "eval_steps")})


def eval_steps(value: Any, get: Lookup) -> Outcome:
    if value is None:
        return Outcome()
    if get("eval_strategy") != "steps":
        return Outcome(left_out=f"unused while eval_strategy is {get('eval_strategy')}")
    return eval_strategy("steps", get)


def log_completions(value: Any, get: Lookup) -> Outcome:
    every = interval(get("logging_steps"), get, "logging_steps") if flag(value) else 0
    return Outcome({"monitor.log_completions_every": every})


def rollout_correction(value: Any, get: Lookup) -> Outcome:
    """vllm_importance_sampling_correction and _mode together are grpo's one mode (none: off)."""
    on = flag(get("vllm_importance_sampling_correction"))
    return Outcome({"algo.rollout_correction.mode": get("vllm_importance_sampling_mode") if on else "none"})


def rollout_correction_cap(value: Any, get: Lookup) -> Outcome:
    if value is None:
        return Outcome()  # the deprecated name unset, or the bound left to the other field
    return Outcome({"algo.rollout_correction.cap": number(value)})


def epsilon(value: Any, get: Lookup) -> Outcome:
    high = get("epsilon_high")
    return Outcome({"algo.epsilon_low": number(value), "algo.epsilon_high": number(value if high is None else high)})


def epsilon_high(value: Any, get: Lookup) -> Outcome:
    return Outcome({"algo.epsilon_high": number(get("epsilon") if value is None else value)})


def ref_sync_every(value: Any, get: Lookup) -> Outcome:
    """sync_ref_model and ref_model_sync_steps are grpo's one interval (0: off)."""
    if not flag(get("sync_ref_model")):
        return Outcome({"algo.ref_sync.every": 0})
    return Outcome({"algo.ref_sync.every": number(get("ref_model_sync_steps"), int)})


def gradient_checkpointing(value: Any, get: Lookup) -> Outcome:
    """transformers 5 renamed it activation_checkpointing; the new name wins when set."""
    if get("activation_checkpointing") is not None:
        return Outcome(left_out="activation_checkpointing, also set, wins (as in transformers)")
    return Outcome({"model.gradient_checkpointing": bool(value)})


def activation_checkpointing(value: Any, get: Lookup) -> Outcome:
    chosen = get("gradient_checkpointing") if value is None else value
    return Outcome({"model.gradient_checkpointing": bool(chosen)})


DTYPES = {"auto": "auto", "float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "fp32": "fp32", "bf16": "bf16"}


def model_init_kwargs(value: Any, get: Lookup) -> Outcome:
    if value is None:
        return Outcome()
    if not isinstance(value, Mapping):
        raise BadTrlValue(f"expected a mapping of from_pretrained's keyword arguments, got {value!r}")
    overrides: dict[str, Any] = {}
    for name in ("dtype", "torch_dtype"):  # torch_dtype: transformers 4's spelling
        if name in value:
            if str(value[name]).removeprefix("torch.") not in DTYPES:
                raise BadTrlValue(f"{name}={value[name]!r}: grpo's model.dtype is auto, fp32, bf16 or fp16")
            overrides["model.dtype"] = DTYPES[str(value[name]).removeprefix("torch.")]
    if "trust_remote_code" in value:
        overrides["model.trust_remote_code"] = flag(value["trust_remote_code"])
    rest = sorted(set(value) - {"dtype", "torch_dtype", "trust_remote_code"})
    why = f"{', '.join(rest)}: grpo loads the model with transformers' defaults for these" if rest else ""
    return Outcome(overrides, why)


# generation_kwargs names with a rollout.* key of their own (transformers' and vLLM's spellings);
# grpo refuses them inside rollout.generation_kwargs, so they move to that key
LIFTED = {
    "temperature": "rollout.temperature",
    "top_p": "rollout.top_p",
    "top_k": "rollout.top_k",
    "min_p": "rollout.min_p",
    "repetition_penalty": "rollout.repetition_penalty",
    "max_new_tokens": "rollout.max_new_tokens",
    "max_tokens": "rollout.max_new_tokens",
    "min_new_tokens": "rollout.min_new_tokens",
    "min_tokens": "rollout.min_new_tokens",
}


def generation_kwargs(value: Any, get: Lookup) -> Outcome:
    """A name with a rollout.* key goes to that key; the rest pass to generation as they are.

    >>> generation_kwargs({"min_new_tokens": 4, "suppress_tokens": [5]}, {}.get).overrides
    {'rollout.generation_kwargs': {'suppress_tokens': [5]}, 'rollout.min_new_tokens': 4}
    """
    if value is None:
        return Outcome()
    if not isinstance(value, Mapping):
        raise BadTrlValue(f"expected a mapping, got {value!r}")
    rest = {name: v for name, v in value.items() if name not in LIFTED}
    overrides: dict[str, Any] = {"rollout.generation_kwargs": rest} if rest else {}
    for name, key in LIFTED.items():
        if name in value:
            overrides[key] = value[name]
    return Outcome(overrides)


def max_turns(value: Any, get: Lookup) -> Outcome:
    if value is None:
        return Outcome(left_out="TRL's None sets no limit; grpo's env.max_turns always has one")
    return Outcome({"env.max_turns": number(value, int) + 1})  # TRL counts the calls after the first turn


def none_as(neutral: Any, key: str, kind: type = float) -> Converter:
    """A field whose None means off, where grpo's key spells off as `neutral` (0, 0.0)."""

    def convert(value: Any, get: Lookup) -> Outcome:
        return Outcome({key: neutral if value is None else number(value, kind)})

    return convert


def mapping(key: str) -> Converter:
    """A dict field whose None means empty."""

    def convert(value: Any, get: Lookup) -> Outcome:
        if value is not None and not isinstance(value, Mapping):
            raise BadTrlValue(f"expected a mapping, got {value!r}")
        return Outcome({key: dict(value or {})})

    return convert


def mapped(table: Mapping[Any, Any], key: str) -> Converter:
    """A field whose values are spelled otherwise (scale_rewards: True is group)."""

    def convert(value: Any, get: Lookup) -> Outcome:
        if value not in table:
            raise BadTrlValue(f"one of {', '.join(str(v) for v in table)} expected")
        return Outcome({key: table[value]})

    return convert


def only(expected: Callable[[Any], bool], why: str) -> Converter:
    """A field grpo has no key for, whose TRL value it already runs as (`expected`): other values are
    left out, with `why`."""

    def convert(value: Any, get: Lookup) -> Outcome:
        return Outcome() if expected(value) else Outcome(left_out=why)

    return convert
