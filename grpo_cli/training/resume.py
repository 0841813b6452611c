"""A resume must run the config the checkpoint was trained with, up to changes that leave the maths alone."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from grpo_cli.checkpoint import read_trainer_state
from grpo_cli.config.dotted import flatten
from grpo_cli.config.schema import TrainConfig
from grpo_cli.errors import GrpoError

# Keys a resumed run may change freely: how long it runs, what it logs and saves, where and how
# fast it computes. Anything else (G, lr, model, rewards, algorithm...) changes what is learnt.
# train.steps only while no schedule is a function of it (steps_schedules).
RESUMABLE_CHANGES = (
    "train.steps",
    "train.save_every",
    "train.eval_every",
    "train.resume",
    "train.resume_allow_changes",
    "train.device",
    "train.threads",
    "train.empty_cache_every",
    "monitor.",
    "eval.",
    "guard.",
    "debug.",
    "reward.num_workers",
    "model.cache_dir",  # where a GGUF file's conversion is kept: the same weights from any folder
    "reward.timeout_s",
    "sandbox.workers",
    "sandbox.prewarm",
    "distributed.",  # the global batch is the same for any number of processes (the trainer says what differs)
)


def config_changes(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Dotted keys whose values differ, e.g. `rollout.num_generations: 8 -> 4`.

    >>> config_changes({"a": {"b": 1, "c": [1, 2]}}, {"a": {"b": 2, "c": [1, 2]}})
    ['a.b: 1 -> 2']
    """
    before, after = flatten(saved), flatten(current)
    keys = sorted(set(before) | set(after))
    return [
        f"{k}: {before.get(k, '<absent>')} -> {after.get(k, '<absent>')}" for k in keys if before.get(k) != after.get(k)
    ]


def steps_schedules(config: dict[str, Any]) -> list[str]:
    """The settings of `config` whose schedule runs on progress = step / train.steps, as key=value.

    Changing train.steps on resume moves such a run within them: a three_phase run at step 200 of
    300 resumed with 600 steps goes back to phase 1, and a cosine lr jumps back up. A constant lr
    (after warmup) and a constant curriculum do not depend on it: a run may simply go on longer.

    >>> steps_schedules({"optim": {"scheduler": "cosine"}, "curriculum": {"name": "constant"}})
    ['optim.scheduler=cosine']
    """
    flat = flatten(config)
    keys = ("optim.scheduler", "curriculum.name")
    return [f"{key}={flat[key]}" for key in keys if flat[key] != "constant"]


def check_resume_config(saved: dict[str, Any], current: dict[str, Any], checkpoint: str, allow: bool) -> list[str]:
    """Raise on changes that alter the maths unless `allow`; return every change, to be logged."""
    changes = config_changes(saved, current)
    blocking = [c for c in changes if not c.split(":", 1)[0].startswith(RESUMABLE_CHANGES)]
    schedules = steps_schedules(current)
    if schedules:
        blocking += [
            f"{c} (the length of {', '.join(schedules)}: progress is step / train.steps)"
            for c in changes
            if c.startswith("train.steps:")
        ]
    if blocking and not allow:
        raise GrpoError(
            f"resuming from {checkpoint} with a different config: {'; '.join(blocking)}. These change the "
            "training maths; run with the checkpoint's values, start a new run (another hydra.run.dir, or "
            "train.resume=never), or set train.resume_allow_changes=true"
        )
    return changes


def check_resume(checkpoint: Path, cfg: TrainConfig) -> list[str]:
    """Compare `cfg` with the config saved in `checkpoint` (cheap: no model loads); see above."""
    saved = read_trainer_state(checkpoint)["config"]
    current = json.loads(json.dumps(asdict(cfg)))  # the JSON round trip the saved one took
    return check_resume_config(saved, current, str(checkpoint), cfg.train.resume_allow_changes)
