"""How varied and how repetitive the sampled completions are: the signs of a policy collapsing to
one answer or looping, which a climbing reward hides. Computed on token ids (padding removed), so
the figures mean the same for any tokenizer's text.
"""

from __future__ import annotations

import math
from typing import Any

from grpo_cli.stats import EmaMoments, nanmean

REPETITION_N = 3  # n-gram order of the repetition rate: short enough to see in a few-token completion
REPETITION_MOMENTUM = 0.9  # EMA of past steps' repetition rates that a jump is measured against


def ngrams(seq: list[int], n: int) -> list[tuple[int, ...]]:
    return [tuple(seq[i : i + n]) for i in range(len(seq) - n + 1)]


def distinct_n(seqs: list[list[int]], n: int = 2) -> float:
    """Distinct n-grams over all n-grams of the sequences (Li et al., 2016); NaN with none.

    >>> distinct_n([[1, 2, 3], [1, 2, 4]])  # bigrams 12 23 12 24: three distinct of four
    0.75
    """
    grams = [gram for seq in seqs for gram in ngrams(seq, n)]
    return len(set(grams)) / len(grams) if grams else math.nan


def diversity_metrics(seqs: list[list[int]], group_size: int) -> dict[str, float]:
    """distinct-2 within each group (averaged over groups) and over the whole batch, and the share
    of groups whose completions are all identical (such a group has zero advantage everywhere)."""
    groups = [seqs[i : i + group_size] for i in range(0, len(seqs), group_size)]
    return {
        "diversity/distinct2_group": nanmean([distinct_n(group) for group in groups]),
        "diversity/distinct2_batch": distinct_n(seqs),
        "diversity/frac_identical_groups": sum(all(s == g[0] for s in g) for g in groups) / len(groups),
    }


def repetition_rate(seqs: list[list[int]], n: int = REPETITION_N) -> float:
    """Mean over completions of the share of their n-grams already seen earlier in the same
    completion (seq-rep-n, Welleck et al., 2019): 0 for no repeat, towards 1 for a loop. Completions
    shorter than n are left out; NaN when all are.

    >>> round(repetition_rate([[7, 7, 7, 7, 7], [1, 2, 3, 4]]), 6)  # 777 three times: 2 of 3 repeat; none
    0.333333
    """
    rates = []
    for seq in seqs:
        grams = ngrams(seq, n)
        if grams:
            rates.append(1 - len(set(grams)) / len(grams))
    return sum(rates) / len(rates) if rates else math.nan


class RepetitionAlert:
    """Raises an alert when a step's repetition rate jumps `threshold` above the running mean of the
    steps before it: a steady rate, high or low, is the task's; a jump is the policy starting to
    loop. One alert per episode: while the rate stays `threshold` above the lagging mean (a steady
    climb) it is said once, and again only after a step back under it. Its running mean is part of
    the TrainState, so a resumed run alerts as the original would.

    >>> alert = RepetitionAlert(0.2)
    >>> [alert.observe(rate) for rate in (0.3, 0.32, 0.28)]
    [None, None, None]
    >>> alert.observe(0.7)
    'repetition/rate jumped to 0.70 (running mean 0.30): completions are starting to repeat themselves'
    """

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.moments = EmaMoments()
        self.jumping = False  # the last step was above the mean by threshold (an episode under way)

    def observe(self, rate: float) -> str | None:
        if math.isnan(rate):
            return None
        mean, seeded = self.moments.mean, self.moments.seeded
        self.moments.update([rate], REPETITION_MOMENTUM)
        jumping = self.threshold > 0 and seeded and rate - mean > self.threshold
        said, self.jumping = self.jumping, jumping
        if jumping and not said:
            return (
                f"repetition/rate jumped to {rate:.2f} (running mean {mean:.2f}): "
                "completions are starting to repeat themselves"
            )
        return None

    def state_dict(self) -> dict[str, Any]:
        moments = self.moments
        return {"mean": moments.mean, "var": moments.var, "seeded": moments.seeded, "jumping": self.jumping}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.moments.mean, self.moments.var, self.moments.seeded = state["mean"], state["var"], state["seeded"]
        self.jumping = state["jumping"]
