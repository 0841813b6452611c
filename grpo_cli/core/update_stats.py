"""What one policy_update reports, and the sums it is built from: partial sums per micro-batch,
accumulated over the update's steps and summed over data-parallel processes once at the end."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from grpo_cli.core.parallel import Collective


@dataclass
class UpdateStats:
    loss: float  # mean over optimizer steps of the step's full loss
    kl: float | None  # mean per loss token; None when beta = 0 (no reference)
    clip_frac_low: float  # share of loss tokens whose lower clip changed the objective
    clip_frac_high: float
    grad_norm: float  # mean over applied steps, before clipping; NaN when none was applied
    optimizer_steps: int  # applied steps (each advances the lr schedule by one)
    skipped_updates: int  # non-finite loss or gradient: weights and optimizer state left alone
    entropy: float  # mean entropy (nats) over the completions' tokens, under the policy that sampled them
    # the optional terms' figures, each a mean per loss token, present only while its term is on:
    # clip_frac/dual, entropy/selected, rollout_correction/weight, rollout_correction/capped,
    # rollout/engine_gap (an engine that is not the policy samples: rollout.backend=vllm),
    # off_policy_mask/dropped, vespo/weight, router/aux_loss (the router's load-balancing loss)
    variants: dict[str, float] = field(default_factory=dict)

    def metrics(self) -> dict[str, float | int | None]:
        return {
            **self.variants,
            "loss": self.loss,
            "entropy": self.entropy,
            "kl": self.kl,
            "clip_frac": self.clip_frac_low + self.clip_frac_high,
            "clip_frac/low": self.clip_frac_low,
            "clip_frac/high": self.clip_frac_high,
            "grad_norm": self.grad_norm,
            "optimizer_steps": self.optimizer_steps,
            "skipped_updates": self.skipped_updates,
        }


@dataclass
class EntropySum:
    """Token entropies summed over the completion mask, measured on the pass that sees every row
    under the sampling policy: the behaviour pass when there is one, else the single update pass."""

    total: float = 0.0
    tokens: float = 0.0

    def add(self, entropies: torch.Tensor, mask: torch.Tensor) -> None:
        self.total += (entropies * mask).sum().item()
        self.tokens += mask.sum().item()

    def mean(self) -> float:
        return self.total / self.tokens if self.tokens else math.nan


@dataclass
class MicroSums:
    """One micro-batch's partial sums: its share of the step's loss and the figures it reports."""

    loss: float
    kl: float
    clip_low: float
    clip_high: float
    tokens: float  # loss tokens
    entropy: float  # summed token entropies; 0 when the behaviour pass measured them
    entropy_tokens: float
    variants: dict[str, float] = field(default_factory=dict)  # UpdateStats.variants' names: sums over loss tokens
    # algo.adaptive_entropy: entropies summed over the bonus's tokens (the kept ones) under the step's
    # weights, and their count; 0 while it is off
    kept_entropy: float = 0.0
    kept_tokens: float = 0.0


@dataclass
class UpdateTotals:
    """Everything one policy_update reports, accumulated step by step and summed over processes
    once at the end (so every process returns the same figures)."""

    loss: float = 0.0  # over applied steps
    kl: float = 0.0
    clip_low: float = 0.0
    clip_high: float = 0.0
    tokens: float = 0.0
    entropy: EntropySum = field(default_factory=EntropySum)
    variants: dict[str, float] = field(default_factory=dict)
    norms: list[float] = field(default_factory=list)  # applied steps' gradient norms, before clipping
    steps: int = 0
    skipped: int = 0

    def add(self, sums: MicroSums) -> None:
        self.kl += sums.kl
        self.clip_low += sums.clip_low
        self.clip_high += sums.clip_high
        self.tokens += sums.tokens
        self.entropy.total += sums.entropy
        self.entropy.tokens += sums.entropy_tokens
        for name, value in sums.variants.items():
            self.variants[name] = self.variants.get(name, 0.0) + value

    def applied(self, grad_norm: float, step_loss: float) -> None:
        self.steps += 1
        self.norms.append(grad_norm)
        self.loss += step_loss

    def stats(self, collective: Collective, with_kl: bool) -> UpdateStats:
        names = sorted(self.variants)  # the same in every process: the config decides which terms are on
        local = [self.kl, self.clip_low, self.clip_high, self.tokens, self.entropy.total, self.entropy.tokens]
        summed = collective.sum(torch.tensor(local + [self.variants[n] for n in names], dtype=torch.float64)).tolist()
        kl, low, high, tokens, self.entropy.total, self.entropy.tokens = summed[: len(local)]
        tokens = tokens or math.nan  # no loss token (a skipped step): per-token figures are NaN, not 0
        return UpdateStats(
            loss=self.loss / self.steps if self.steps else math.nan,
            kl=kl / tokens if with_kl else None,
            clip_frac_low=low / tokens,
            clip_frac_high=high / tokens,
            grad_norm=sum(self.norms) / len(self.norms) if self.norms else math.nan,
            optimizer_steps=self.steps,
            skipped_updates=self.skipped,
            entropy=self.entropy.mean(),
            variants={name: value / tokens for name, value in zip(names, summed[len(local) :])},
        )
