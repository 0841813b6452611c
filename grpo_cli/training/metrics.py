"""One step's figures for metrics.jsonl: the names users grep for, computed by the shared helpers."""

from __future__ import annotations

import math
from typing import Any

from grpo_cli.config.schema import EnvConfig
from grpo_cli.core.advantages import AdvantageStats
from grpo_cli.core.update_stats import UpdateStats
from grpo_cli.monitor.diversity import diversity_metrics, repetition_rate
from grpo_cli.rewards import FusionResult
from grpo_cli.rollout import Rollout
from grpo_cli.stats import nan_fraction, nanmean, nanstd


def step_metrics(
    step: int,
    fusion: FusionResult,
    generated: FusionResult,
    adv_stats: AdvantageStats,
    update: UpdateStats,
    rollout: Rollout,
    lr: float,
    timings: dict[str, float],
    diagnostics: dict[str, Any],
    peak_memory_mib: float,
) -> dict[str, Any]:
    """`fusion`: the batch trained on; `generated`: every completion the step generated (the same
    batch, but under dynamic sampling, which drops groups without a signal). The reward figures are
    the generated batch's, i.e. the policy's: the kept groups of a binary reward sit near 0.5 whatever
    the policy's accuracy (sampling/kept_reward_mean has theirs)."""
    lengths = rollout.lengths.float()
    seqs = rollout.token_lists()
    return {
        "step": step,
        "reward/mean": nanmean(generated.fused),
        "reward/std": nanstd(generated.fused),
        # the raw reward (FusionResult.raw): what the adaptive clip, the guard, the hacking alert and the
        # sweep objective read
        "reward/raw_mean": nanmean(generated.raw),
        "reward/raw_std": nanstd(generated.raw),
        **{f"reward/{name}/mean": nanmean(values) for name, values in generated.per_function.items()},
        **{f"reward/{name}/nan_frac": nan_fraction(values) for name, values in generated.per_function.items()},
        # which completions of the trained batch (the completion log's rows: row = prompt·G + k) each
        # function could not score, for tracing a failure
        **{f"reward/{name}/nan_indices": indices for name, indices in fusion.nan_indices.items()},
        **{f"reward/{name}": value for name, value in generated.logged.items()},  # a TRL function's log_metric
        **{f"weight/{name}": weight for name, weight in fusion.effective_weights.items()},
        **{f"weight_effect/{name}": share for name, share in fusion.weight_effect.items()},
        "reward/masked_functions": len(fusion.masked),
        **diagnostics,
        **update.metrics(),
        "completion_len/mean": lengths.mean().item(),
        "completion_len/max": lengths.max().item(),
        "frac_truncated": rollout.truncated.float().mean().item(),
        "frac_zero_std_groups": adv_stats.frac_zero_std_groups,
        "frac_unscorable": len(adv_stats.unscorable_indices) / len(fusion.fused),
        **diversity_metrics(seqs, rollout.group_size),
        "repetition/rate": repetition_rate(seqs),
        "lr": lr,
        **{f"time/{name}_s": seconds for name, seconds in timings.items()},
        # generation alone for tokens; the whole step (score and update included) for completions
        "throughput/tokens_per_s": lengths.sum().item() / timings["generate"],
        "throughput/completions_per_s": len(seqs) / timings["step"],
        "memory/peak_mib": peak_memory_mib,
        **environment_metrics(rollout),
    }


def environment_metrics(rollout: Rollout) -> dict[str, float]:
    """A multi-turn rollout's figures (env.*): model turns, failed rows, tool calls, and the share
    of each trajectory's tokens the environment wrote (context, not trained on)."""
    columns = rollout.env_columns
    if not columns:
        return {}
    out = {
        "env/turns_mean": nanmean([float(n) for n in columns["env_turns"]]),
        "env/error_frac": sum(why is not None for why in columns["env_error"]) / len(columns["env_error"]),
        "env/context_token_frac": 1.0 - rollout.model_mask.sum().item() / max(1, rollout.completion_mask.sum().item()),
    }
    if "env_tool_calls" in columns:
        out["env/tool_calls_mean"] = nanmean([math.nan if n is None else float(n) for n in columns["env_tool_calls"]])
    return out


def environment_alert(rollout: Rollout, env: EnvConfig) -> str | None:
    """One line when an environment (env=agent: the user's harness) failed rows (they are out of the
    step; the run goes on)."""
    errors = [why for why in (rollout.env_columns or {}).get("env_error", []) if why is not None]
    if not errors:
        return None
    who = "the agent" if env.name == "agent" else "the environment"
    return f"{who} failed on {len(errors)} of {len(rollout.texts)} rows (their rewards None); first: {errors[0]}"


def unanswered_turns_alert(rollout: Rollout, env: EnvConfig) -> str | None:
    """One line when no trajectory got past its first model turn because every one was cut at
    rollout.max_new_tokens (no EOS): a cut turn is unfinished, so the environment never answers it,
    and a multi-turn run is silently single-turn (a random tiny model at the defaults). Not under
    env=agent: a cut reply still reaches the harness, which decides whether to ask again."""
    columns = rollout.env_columns
    if not columns or env.max_turns < 2 or env.name == "agent" or not bool(rollout.truncated.all()):
        return None
    if any(turns != 1 or why is not None for turns, why in zip(columns["env_turns"], columns["env_error"])):
        return None
    return (
        f"no trajectory reached a second turn: all {len(rollout.texts)} first model turns were cut at "
        "rollout.max_new_tokens before an EOS, and a cut turn gets no answer from the environment; "
        "raise rollout.max_new_tokens (or use a model that ends its turns)"
    )


def step_samples(
    examples: list[dict[str, Any]], rollout: Rollout, fusion: FusionResult, advantages: list[float], limit: int
) -> list[dict[str, Any]]:
    """The first `limit` completions with their per-function rewards, for the completion log."""
    g = rollout.group_size
    return [
        {
            "prompt": examples[i // g]["prompt"],
            "completion": rollout.texts[i],
            "rewards": {name: values[i] for name, values in fusion.per_function.items()},
            "reward": fusion.fused[i],
            "advantage": advantages[i],
            **({"messages": rollout.messages[i]} if rollout.messages is not None else {}),
            **({"env_error": rollout.env_columns["env_error"][i]} if rollout.env_columns else {}),
            **({"logged": {column: values[i] for column, values in fusion.extra.items()}} if fusion.extra else {}),
        }
        for i in range(min(len(fusion.fused), limit))
    ]


def nan_rate_alerts(fusion: FusionResult, threshold: float) -> list[str]:
    """A reward function that fails on much of a batch, before failure isolation masks it (a masked
    function scores nothing by design and has had its own alert). Rows the environment failed are
    the environment's alert's, not the function's."""
    if threshold <= 0:
        return []
    failed = set(fusion.env_failed)
    return [
        f"reward {name} returned NaN for {share:.0%} of the batch (monitor.nan_alert={threshold:g}); "
        f"first error: {fusion.errors.get(name) or 'none raised (the function returned None/NaN)'}"
        for name, values in fusion.per_function.items()
        if name not in fusion.masked
        and (share := nan_fraction([v for j, v in enumerate(values) if j not in failed])) >= threshold
    ]
