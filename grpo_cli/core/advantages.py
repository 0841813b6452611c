"""Group-relative advantages (docs/architecture.md §3, as TRL computes them)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo_cli.stats import SCALES, constant_groups, group_zscores


@dataclass
class AdvantageStats:
    frac_zero_std_groups: float
    unscorable_indices: list[int]
    reward_std_mean: float  # mean over groups of the within-group std


def _nan_std(x: torch.Tensor, valid: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Unbiased std over valid entries; 0 where fewer than two are valid."""
    if dim is None:
        x, valid, dim = x.reshape(1, -1), valid.reshape(1, -1), 1
    n = valid.sum(dim, keepdim=True)
    mean = torch.where(valid, x, 0.0).sum(dim, keepdim=True) / n.clamp(min=1)
    sq = torch.where(valid, (x - mean) ** 2, 0.0).sum(dim, keepdim=True)
    std = torch.sqrt(sq / (n - 1).clamp(min=1))
    return torch.where(n > 1, std, torch.zeros_like(std))


def zero_spread_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """[groups] bool: `stats.constant_groups` on the float32 tensor the trainer holds. Such a group
    gets advantage exactly 0, so dynamic sampling drops it by this same test on the same tensor.

    >>> zero_spread_groups(torch.tensor([1.0, 1.0, 0.0, 1.0, float("nan"), 2.0, float("nan"), float("nan")]), 2)
    tensor([ True, False,  True,  True])
    """
    return torch.tensor(constant_groups(rewards.tolist(), group_size), dtype=torch.bool)


def group_advantages(
    rewards: torch.Tensor, group_size: int, scale_rewards: str = "group"
) -> tuple[torch.Tensor, AdvantageStats]:
    """Advantages for rewards laid out group by group (G consecutive entries per prompt): the
    group z-scores of `stats.group_zscores`, the same function the `group_zscore` normalisation is.

    NaN rewards (unscorable) are left out of their group's statistics and get advantage 0.
    A group whose valid rewards are all equal gets exactly 0: no signal, and no float noise.
    scale_rewards: `group` divides by the group std, `batch` by the std of the whole batch,
    `none` only centres (Dr. GRPO).
    """
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    if scale_rewards not in SCALES:
        raise ValueError(f"unknown scale_rewards {scale_rewards!r}")
    values = rewards.tolist()
    adv = torch.tensor(group_zscores(values, group_size, scale_rewards), dtype=torch.float64)
    valid = ~torch.isnan(adv)
    r = rewards.double().view(-1, group_size)
    stats = AdvantageStats(
        frac_zero_std_groups=sum(constant_groups(values, group_size)) / (len(values) // group_size),
        unscorable_indices=torch.nonzero(~valid).view(-1).tolist(),
        reward_std_mean=_nan_std(r, ~torch.isnan(r), dim=1).mean().item(),
    )
    return torch.where(valid, adv, 0.0).to(torch.float32), stats
