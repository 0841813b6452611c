"""Every field of TRL's `GRPOConfig` and what it is in grpo: the one definition behind
`grpo train trl_config=FILE`, the `algo=trl_defaults` preset's test and docs/coming-from-trl.md.

Each field of TRL 1.16's GRPOConfig (its own and the transformers TrainingArguments a GRPO run
turns) is a `TrlField`: TRL's default, the grpo keys it becomes with the conversion when it is more
than a rename (grpo_cli/config/trl/values.py), or, with no keys, why grpo has none. The defaults
are here, not read from TRL, so a file converts without TRL installed; tests/config/test_trl_config.py
holds them to the installed TRL's. A TrainingArguments field not listed is still a valid field of a
TRL config: `trainer_reason` says why grpo has nothing for it. grpo_cli/config/trl/convert.py
applies the table to a file's fields.
"""

from __future__ import annotations

from grpo_cli.config.trl.field import HUB, TrlField
from grpo_cli.config.trl.sampling_fields import SAMPLING
from grpo_cli.config.trl.training_fields import TRAINING

__all__ = ["FIELDS", "SECTIONS", "TRAINER_FALLBACK", "TRAINER_REASONS", "TrlField", "trainer_reason"]

SECTIONS: dict[str, tuple[TrlField, ...]] = {**SAMPLING, **TRAINING}  # the page's order

FIELDS: dict[str, TrlField] = {f.name: f for section in SECTIONS.values() for f in section}

# Why grpo has nothing for a TrainingArguments field not in FIELDS, by the start of its name.
TRAINER_REASONS = (
    (("hub_", "push_to_hub"), HUB),
    (
        ("eval_", "per_device_eval", "prediction_loss", "batch_eval", "include_for_metrics", "bf16_full", "fp16_full"),
        "transformers' evaluation loop; grpo evaluates held-out prompts every train.eval_every steps",
    ),
    (
        ("dataloader_", "train_sampling", "length_column", "group_by_length", "label_names"),
        "grpo has no DataLoader: it draws the prompts itself",
    ),
    (
        ("ddp_", "fsdp_", "deepspeed", "accelerator_config", "parallelism_config", "local_rank", "tp_size"),
        "grpo's processes are distributed.* (accelerate launch underneath)",
    ),
    (
        ("log", "report", "run_name", "project", "trackio", "include_num_input", "skip_memory", "disable_tqdm"),
        "grpo's logging is metrics.jsonl, the console (monitor.*) and monitor.trackers",
    ),
    (
        ("save_", "load_best", "metric_for_best", "greater_is_better", "restore_callback", "enable_jit", "ignore_data"),
        "grpo saves whole, atomic checkpoints every train.save_every steps",
    ),
)
TRAINER_FALLBACK = "a transformers Trainer setting that grpo's own training loop has no counterpart for"


def trainer_reason(name: str) -> str:
    """Why grpo has nothing for a TrainingArguments field the table does not list."""
    for prefixes, reason in TRAINER_REASONS:
        if name.startswith(prefixes):
            return reason
    return TRAINER_FALLBACK
