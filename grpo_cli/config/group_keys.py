"""Keys that only some options of a config group read: set under another option, they would do
nothing, so they are refused in one line naming the option that reads them.

A user's `data.path=prompts.jsonl` without `data=jsonl` trained on the arithmetic task (exit 0), and
`model.path=ORG/NAME` without `model=hf` trained the random tiny model. A group's options differ by
one key (`model.kind`, `data.kind`, `precision.dtype`, `curriculum.name`) whose values are the
packaged options' names, so the option to pick is the value that reads the key. A key counts as set
when it differs from the schema's default: no packaged option sets a key it ignores
(tests/config/test_compose.py composes and validates every one).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from grpo_cli.config.checks import fail

# group -> (the key that tells its options apart, {key: the options that read it}); every other key
# of the group is read by every option.
READ_BY: dict[str, tuple[str, dict[str, tuple[str, ...]]]] = {
    "model": (
        "kind",
        {
            "path": ("hf",),
            "gguf_file": ("hf",),
            "package": ("hf",),
            "cache_dir": ("hf",),
            "trust_remote_code": ("hf",),
            "tiny": ("tiny",),
        },
    ),
    "data": (
        "kind",
        {
            "path": ("jsonl", "hf"),
            "prompt_field": ("jsonl", "hf"),  # math and code read their packaged files' own `prompt`
            "answer_field": ("jsonl", "hf"),
            "split": ("hf",),  # a jsonl file is one table: its held-out rows are data.eval_fraction's
            "subset": ("hf",),
            "num_examples": ("arithmetic",),
            "max_operand": ("arithmetic",),
            "operations": ("arithmetic",),
        },
    ),
    "precision": ("dtype", {"autocast": ("bf16", "fp16"), "grad_scaler": ("fp16",)}),
    "curriculum": ("name", {"interpolate": ("three_phase", "phased")}),  # constant has nothing to blend
    "env": (  # env=none has no environment to read any (config/env_checks.py)
        "name",
        {
            "target": ("custom", "trl"),
            "tools": ("tools",),
            "kwargs": ("custom",),
            **dict.fromkeys(("agent", "command", "request_timeout_s"), ("agent",)),
            **dict.fromkeys(
                ("max_turns", "max_tokens", "max_observation_tokens", "timeout_s", "token_mode"),
                ("code_feedback", "calculator", "trl", "tools", "custom", "agent"),
            ),
        },
    ),
}
# What an option does, where its name alone does not say why it ignores a key.
MEANS = {
    "tiny": "a random-init model built in the run directory",
    "arithmetic": "the synthetic a+b= problems",
    "math": "the packaged word problems",
    "code": "the packaged code tasks",
    "fp32": "no mixed precision",
    "constant": "the configured weights throughout",
    "none": "one model turn per completion, no environment",
}


def check_group_keys(group: str, section: Any) -> None:
    """Refuse a key of `section` (the config of `group`) that its chosen option ignores."""
    option_key, read_by = READ_BY[group]
    option = getattr(section, option_key)
    default = type(section)()
    for key, readers in read_by.items():
        value = getattr(section, key)
        if option in readers or value == getattr(default, key):
            continue
        shown = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
        means = f" ({MEANS[option]})" if option in MEANS else ""
        pick = " or ".join(f"{group}={reader}" for reader in readers)
        why = f"read by {pick} only, and this run's {group}={option}{means} ignores it"
        fail(f"{group}.{key}", shown, f"{why}: add {pick}, or drop {group}.{key}")
