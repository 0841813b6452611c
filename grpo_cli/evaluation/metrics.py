"""Evaluation metrics over scored completions laid out group by group (G per prompt).

A completion *succeeds* when one reward function's raw score reaches a threshold (by default the
first configured function at 1.0: `exact_match` for the arithmetic reward). Accuracy is the share
of completions that succeed; pass@k is the unbiased estimator of Chen et al. 2021 averaged over
prompts. Everything else is a NaN-aware mean from `grpo_cli.stats`, the code the trainer's
metrics use, so a figure here and in metrics.jsonl are computed alike.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from grpo_cli.config.schema import EvalMetricsConfig
from grpo_cli.errors import GrpoError
from grpo_cli.stats import nanmean


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k completions drawn without replacement from n, c of them
    correct, is correct: 1 − C(n−c, k)/C(n, k) (Chen et al. 2021, "Evaluating Large Language
    Models Trained on Code"), as their product form, which never builds the huge binomials.

    >>> pass_at_k(5, 2, 2), pass_at_k(5, 0, 3), pass_at_k(5, 4, 2)
    (0.7, 0.0, 1.0)
    """
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs 1 <= k <= n (samples per prompt), got n={n}")
    if n - c < k:  # every draw of k holds a correct one
        return 1.0
    # C(n−c, k)/C(n, k) = Π_{i=n−c+1}^{n} (1 − k/i)
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at_k(successes: Sequence[Sequence[bool]], k: int) -> float:
    """pass@k averaged over prompts, one list of per-completion successes per prompt.

    >>> mean_pass_at_k([[True, False], [False, False]], 1), mean_pass_at_k([[True, False], [False, False]], 2)
    (0.25, 0.5)
    """
    return nanmean([pass_at_k(len(group), sum(group), k) for group in successes])


@dataclass(frozen=True)
class SuccessRule:
    """A completion succeeds when function `name`'s raw score is >= `threshold` (NaN never does)."""

    name: str
    threshold: float

    @classmethod
    def resolve(cls, names: Sequence[str], rule: EvalMetricsConfig) -> SuccessRule:
        """`eval.success=null` picks the first configured function; an unknown name is the user's error."""
        success, threshold = rule.success, rule.success_threshold
        if not names:
            raise GrpoError("reward.functions is empty: no function can decide success (eval.success)")
        if success is None:
            return cls(names[0], threshold)
        if success not in names:
            close = difflib.get_close_matches(success, names, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise GrpoError(f"eval.success={success}: not a reward function (configured: {', '.join(names)}){hint}")
        return cls(success, threshold)

    def __call__(self, score: float) -> bool:
        return not math.isnan(score) and score >= self.threshold


@dataclass
class ScoredSamples:
    """Per-completion figures, group by group: completions g*G .. g*G+G-1 share a prompt.

    `lengths` are tokens (EOS included) and `truncated` 1.0/0.0; NaN where a rollouts file does
    not say, which then leaves that completion out of the mean.
    """

    group_size: int
    fused: list[float] = field(default_factory=list)
    per_function: dict[str, list[float]] = field(default_factory=dict)
    lengths: list[float] = field(default_factory=list)
    truncated: list[float] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)  # the completions themselves, where the caller kept them

    def add(
        self,
        fused: Sequence[float],
        per_function: dict[str, Sequence[float]],
        lengths: Sequence[float | None],
        truncated: Sequence[bool | None],
        texts: Sequence[str] = (),
    ) -> None:
        """Append one scored batch of whole groups."""
        if len(fused) % self.group_size or not len(fused) == len(lengths) == len(truncated):
            raise ValueError(f"a batch of {len(fused)} completions is not whole groups of {self.group_size}")
        self.fused.extend(fused)
        self.texts.extend(texts)
        for name, values in per_function.items():
            self.per_function.setdefault(name, []).extend(values)
        self.lengths.extend(math.nan if n is None else float(n) for n in lengths)
        self.truncated.extend(math.nan if t is None else float(t) for t in truncated)

    @property
    def prompts(self) -> int:
        return len(self.fused) // self.group_size

    def successes(self, rule: SuccessRule) -> list[list[bool]]:
        """Per prompt, whether each of its completions succeeded."""
        if rule.name not in self.per_function:
            raise GrpoError(f"eval.success={rule.name}: no scores for it (scored: {', '.join(self.per_function)})")
        ok = [rule(v) for v in self.per_function[rule.name]]
        g = self.group_size
        return [ok[i : i + g] for i in range(0, len(ok), g)]


def sample_metrics(samples: ScoredSamples, rule: SuccessRule, ks: Sequence[int] = ()) -> dict[str, float]:
    """accuracy, pass@k for each k, reward/mean, reward/<fn>/mean, length/mean, truncated/rate.

    The names match the trainer's metrics (reward/mean, reward/<fn>/mean), so `eval/` in front
    of them is what training logs. NaN rewards (unscorable) are left out of the means and count
    as failures for accuracy and pass@k: a completion no one could grade did not solve anything.

    >>> s = ScoredSamples(2)
    >>> s.add([1.0, 0.0, 0.0, 0.0], {"em": [1.0, 0.0, 0.0, 0.0]}, [2, 3, 3, 5], [False, False, True, None])
    >>> m = sample_metrics(s, SuccessRule("em", 1.0), ks=[1, 2])
    >>> m["accuracy"], m["pass@1"], m["pass@2"], m["length/mean"], m["truncated/rate"]
    (0.25, 0.25, 0.5, 3.25, 0.3333333333333333)
    """
    if not samples.fused:
        return {}
    successes = samples.successes(rule)
    out = {"accuracy": nanmean([float(ok) for group in successes for ok in group])}
    for k in ks:
        if k > samples.group_size:
            raise GrpoError(
                f"eval.k has {k}, more than the {samples.group_size} completions per prompt: pass@k needs k <= n "
                "(raise rollout.num_generations or lower eval.k)"
            )
        out[f"pass@{k}"] = mean_pass_at_k(successes, k)
    out["reward/mean"] = nanmean(samples.fused)
    out.update({f"reward/{name}/mean": nanmean(values) for name, values in samples.per_function.items()})
    out["length/mean"] = nanmean(samples.lengths)
    out["truncated/rate"] = nanmean(samples.truncated)
    return out


def greedy_answers(prompts: Sequence[Any], samples: ScoredSamples, rule: SuccessRule) -> list[dict[str, Any]]:
    """Each prompt's greedy answer as `grpo eval` writes it to eval.json: the figures say how often
    the model is right, these say what it answered, for reading beside them (and for a diff of two runs).

    >>> s = ScoredSamples(1)
    >>> s.add([1.0, 0.0], {"em": [1.0, 0.0]}, [2, 3], [False, True], ["8", "71"])
    >>> greedy_answers(["3+5=", "6+6="], s, SuccessRule("em", 1.0))[1]
    {'prompt': '6+6=', 'answer': '71', 'solved': False, 'reward': 0.0, 'rewards': {'em': 0.0}, 'truncated': True}
    """
    if samples.group_size != 1 or not len(prompts) == len(samples.texts) == len(samples.fused):
        raise ValueError("greedy answers need one scored completion, with its text, per prompt")
    return [
        {
            "prompt": prompt,
            "answer": samples.texts[i],
            "solved": rule(samples.per_function[rule.name][i]),
            "reward": samples.fused[i],
            "rewards": {name: values[i] for name, values in samples.per_function.items()},
            "truncated": samples.truncated[i] == 1.0,
        }
        for i, prompt in enumerate(prompts)
    ]
