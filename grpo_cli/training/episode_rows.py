"""The update's rows of a batch whose episodes were split into several training rows
(env.token_mode=fork | per_turn, `Rollout.forks`).

Scoring and advantages stay per episode: the rewards score an episode once, and its advantage is
its group's comparison. Each of its rows then trains with that advantage, and, like its main row,
leaves the loss when the episode is unscorable (or truncated, under algo.mask_truncated). A row counts
as a sequence of its own in the loss's denominators, so under the per-sequence losses (grpo, sapo) an
episode of two rows weighs twice one of a single row, and under the token-level ones (dapo, bnpo, the
TRL default) every sampled token weighs the same wherever it lies, as under append
(docs/environments.md, "Token modes").

The update draws its mini-batches as whole groups of equal size (core.update.plan_mini_batches), so each
group's rows (its episodes' main rows, then their later rows) are filled up to the largest group's
count with copies of its first row that carry no loss.
"""

from __future__ import annotations

import torch

from grpo_cli.config.schema import EnvConfig
from grpo_cli.core.loss import completion_loss_mask
from grpo_cli.core.update import UpdateBatch
from grpo_cli.rollout.base import Rollout, padded
from grpo_cli.training.distributed import World


def group_width(rollout: Rollout) -> int:
    """The most training rows a group of `rollout` has: its episodes' main rows and later ones."""
    g, counts = rollout.group_size, [rollout.group_size] * (len(rollout.texts) // rollout.group_size)
    for fork in rollout.forks or []:
        counts[fork.episode // g] += 1
    return max(counts, default=g)


def agreed_width(rollout: Rollout, world: World, env: EnvConfig) -> int:
    """The group width every data-parallel process fills its groups to, so that each takes the same
    micro-batches: the widest of any process's. One collective a step, in every multi-turn run: under
    append too an agent that rewrote its history, or asked for n > 1, opens rows."""
    width = group_width(rollout)
    return max(world.gather_objects(width)) if world.size > 1 and env.name != "none" else width


def update_batch(
    rollout: Rollout,
    advantages: torch.Tensor,
    scores: torch.Tensor,
    mask_truncated: bool,
    pad_id: int,
    width: int = 0,
) -> UpdateBatch:
    """The rows the loss sees for this process's `rollout`, its episodes' `advantages` and fused
    `scores` (NaN: unscorable): the rollout itself, or with the episodes' later rows laid out group
    by group, each group `width` rows at least (data-parallel processes agree on one, so each takes as
    many micro-batches as the others)."""
    if rollout.forks is None and width <= rollout.group_size:
        mask = completion_loss_mask(rollout.model_mask, rollout.truncated, scores, mask_truncated)
        return UpdateBatch(rollout, advantages, mask)
    rows, episode, live = _group_rows(rollout, pad_id, max(width, group_width(rollout)))
    index = torch.tensor(episode, device=advantages.device)
    keep = torch.tensor(live, dtype=torch.float32, device=advantages.device)
    loss_mask = completion_loss_mask(rows.model_mask, rows.truncated, scores[index], mask_truncated) * keep.unsqueeze(1)
    return UpdateBatch(rows, advantages[index] * keep, loss_mask)


def _group_rows(rollout: Rollout, pad: int, width: int) -> tuple[Rollout, list[int], list[bool]]:
    """Every training row, group by group, each group filled to `width` rows; with each row's
    episode and whether it trains (False: a filler)."""
    g, n = rollout.group_size, len(rollout.texts)
    later: dict[int, list[int]] = {}
    for k, fork in enumerate(rollout.forks or []):
        later.setdefault(fork.episode, []).append(k)
    groups = [
        [("main", i) for i in range(start, start + g)]
        + [("fork", k) for i in range(start, start + g) for k in later.get(i, [])]
        for start in range(0, n, g)
    ]
    order = [row for rows in groups for row in rows + [("filler", rows[0][1])] * (width - len(rows))]
    prompts, completions, sampled, logps, episode = [], [], [], [], []
    for kind, k in order:
        if kind == "fork":
            fork = rollout.forks[k]
            prompt, tokens, mask, engine = fork.prompt, fork.tokens, fork.sampled, fork.engine_logps
            episode.append(fork.episode)
        else:
            real = rollout.completion_mask[k].bool()
            prompt = rollout.prompt_ids[k][rollout.prompt_mask[k].bool()].tolist()
            tokens, mask = rollout.completion_ids[k][real].tolist(), rollout.model_mask[k][real].tolist()
            engine = rollout.engine_logps[k][real].tolist() if rollout.engine_logps is not None else [0.0] * len(tokens)
            episode.append(k)
        prompts.append(torch.tensor(prompt, dtype=torch.long))
        completions.append(torch.tensor(tokens, dtype=torch.long))
        sampled.append(torch.tensor(mask, dtype=torch.long) * (kind != "filler"))  # a filler counts in no figure
        logps.append(torch.tensor(engine, dtype=torch.float32))
    device = rollout.prompt_ids.device
    rows = Rollout(
        padded(prompts, pad, "left").to(device),
        padded([torch.ones_like(p) for p in prompts], 0, "left").to(device),
        padded(completions, pad, width=1).to(device),
        padded([torch.ones_like(c) for c in completions], 0, width=1).to(device),
        rollout.truncated[torch.tensor(episode, device=device)],
        [rollout.texts[i] for i in episode],
        width,
        padded(logps, 0.0, width=1).to(device) if rollout.engine_logps is not None else None,
        padded(sampled, 0, width=1).to(device),
    )
    return rows, episode, [kind != "filler" for kind, _ in order]
