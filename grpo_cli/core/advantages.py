"""Group-relative advantages (docs/architecture.md §3, as TRL computes them)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo_cli.stats import STD_EPS


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
    """[groups] bool: fewer than two scorable (non-NaN) rewards, or all of them equal. Such a group
    gets advantage exactly 0, so dynamic sampling drops it by this same test on the same tensor.

    >>> zero_spread_groups(torch.tensor([1.0, 1.0, 0.0, 1.0, float("nan"), 2.0, float("nan"), float("nan")]), 2)
    tensor([ True, False,  True,  True])
    """
    r = rewards.view(-1, group_size)
    valid = ~torch.isnan(r)
    inf = torch.tensor(float("inf"), dtype=r.dtype)
    spread = torch.where(valid, r, -inf).amax(1) - torch.where(valid, r, inf).amin(1)
    return (valid.sum(1) < 2) | (spread == 0)


def group_advantages(
    rewards: torch.Tensor, group_size: int, scale_rewards: str = "group"
) -> tuple[torch.Tensor, AdvantageStats]:
    """Advantages for rewards laid out group by group (G consecutive entries per prompt).

    NaN rewards (unscorable) are left out of their group's statistics and get advantage 0.
    A group whose valid rewards are all equal gets exactly 0: no signal, and no float noise.
    scale_rewards: `group` divides by the group std, `batch` by the std of the whole batch,
    `none` only centres (Dr. GRPO).
    """
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    r = rewards.double().view(-1, group_size)
    valid = ~torch.isnan(r)
    n = valid.sum(1, keepdim=True)
    mean = torch.where(valid, r, 0.0).sum(1, keepdim=True) / n.clamp(min=1)
    centred = torch.where(valid, r - mean, 0.0)
    zero_std = zero_spread_groups(rewards, group_size)
    group_std = _nan_std(r, valid, dim=1)
    if scale_rewards == "group":
        adv = centred / (group_std + STD_EPS)
    elif scale_rewards == "batch":
        adv = centred / (_nan_std(r, valid) + STD_EPS)
    elif scale_rewards == "none":
        adv = centred
    else:
        raise ValueError(f"unknown scale_rewards {scale_rewards!r}")
    adv = torch.where(zero_std.unsqueeze(1) | ~valid, torch.zeros_like(adv), adv)
    stats = AdvantageStats(
        frac_zero_std_groups=zero_std.double().mean().item(),
        unscorable_indices=torch.nonzero(~valid.view(-1)).view(-1).tolist(),
        reward_std_mean=group_std.mean().item(),
    )
    return adv.view(-1).to(torch.float32), stats
