"""Reward-weight curricula: each reward function's weight as a function of training progress
(docs/architecture.md §3 "Curriculum", §7 `curriculum.*`).

`RewardCurriculum(cfg.curriculum, cfg.reward.functions, cfg.train.steps).weights(step)` gives
{function name: weight} for the 0-based step about to run; the reward fusion takes it as its
`weights` and moves a masked function's weight to its fallback. Progress comes from the step index
alone, so a resumed run continues the same schedule and the curriculum has no state to checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from grpo_cli.config.schema import (
    CURRICULA,
    INTERPOLATIONS,
    CurriculumConfig,
    CurriculumPhase,
    RewardFunctionConfig,
)
from grpo_cli.errors import GrpoError

# Seed 001: syntax first, then passing tests, then style (basics -> core goal -> advanced), for
# reward=code. conf/curriculum/three_phase.yaml repeats it for users to read and edit; this copy is
# what `CurriculumConfig(name="three_phase")` with no phases gets in library use.
THREE_PHASE = (
    CurriculumPhase(until=0.2, weights={"code_compiles": 0.7, "code_tests": 0.2, "code_style": 0.1}),
    CurriculumPhase(until=0.6, weights={"code_compiles": 0.3, "code_tests": 0.6, "code_style": 0.1}),
    CurriculumPhase(until=1.0, weights={"code_compiles": 0.1, "code_tests": 0.3, "code_style": 0.6}),
)


def _fail(key: str, value: object, why: str) -> GrpoError:
    return GrpoError(f"invalid value {key}={value!r}: {why}")


def _phases_example(names: Sequence[str]) -> str:
    """A command-line override a user can paste, written with their own first function's name."""
    fn = names[0] if names else "exact_match"
    return f"'curriculum.phases=[{{until:0.5,weights:{{{fn}:2.0}}}},{{until:1.0,weights:{{{fn}:1.0}}}}]'"


class RewardCurriculum:
    """Reward weights by function name over a run of `total_steps` steps.

    Progress p = step / total_steps for the 0-based index of the step about to run. Phase k covers
    p in [b_{k-1}, b_k) with b_{-1} = 0 and b_k its `until`; the last phase lasts to the end of the
    run whatever its `until`. A phase's full weights are the configured ones (reward.functions[].weight)
    with the functions it names replaced.

    - `constant`: the configured weights at every step.
    - `three_phase` / `phased`, `interpolate=step`: the weights of the first phase whose `until` is
      greater than p (the last phase when none is).
    - `interpolate=linear`: phase k's weights are attained at its midpoint m_k = (b_{k-1} + b_k) / 2
      (the last phase's end taken as 1), held before m_0 and after the last midpoint, and blended
      linearly between consecutive midpoints:
      w(p) = w_k + (p - m_k) / (m_{k+1} - m_k) · (w_{k+1} - w_k) for m_k <= p <= m_{k+1}.
      So `linear` equals `step` at every midpoint, and at a boundary b_k it is the mix
      len_k / (len_k + len_{k+1}) of the way from phase k to phase k+1 (half way for equal phases).
      three_phase (boundaries 0.2, 0.6, 1.0; midpoints 0.1, 0.4, 0.8), code_compiles: 0.7 up to
      p = 0.1, 0.5 at p = 0.25, 0.3 at 0.4, 0.2 at 0.6, 0.1 from 0.8 on.
    """

    def __init__(self, cfg: CurriculumConfig, functions: Sequence[RewardFunctionConfig], total_steps: int) -> None:
        if cfg.name not in CURRICULA:
            raise _fail("curriculum.name", cfg.name, f"must be one of {', '.join(CURRICULA)}")
        if cfg.interpolate not in INTERPOLATIONS:
            raise _fail("curriculum.interpolate", cfg.interpolate, f"must be one of {', '.join(INTERPOLATIONS)}")
        if total_steps < 1:
            raise _fail("train.steps", total_steps, "must be at least 1")
        self.name = cfg.name
        self.interpolate = cfg.interpolate
        self.total_steps = total_steps
        self.configured = {fn.name: float(fn.weight) for fn in functions}
        phases = self._phases(cfg)
        self._check_phases(phases)
        # Full weight vectors per phase, in reward.functions order; unnamed functions keep theirs.
        self._weights = [{**self.configured, **{k: float(v) for k, v in p.weights.items()}} for p in phases]
        for i, weights in enumerate(self._weights):
            if not any(w > 0 for w in weights.values()):
                raise GrpoError(
                    f"curriculum.phases[{i}] leaves every reward function at weight 0: the fused reward "
                    "would be undefined; give at least one function a positive weight"
                )
        ends = [p.until for p in phases[:-1]] + [1.0]  # the last phase lasts to the end of the run
        starts = [0.0, *ends[:-1]]
        self._bounds = ends[:-1]
        self._midpoints = [(a + b) / 2 for a, b in zip(starts, ends)]

    # ---- construction ------------------------------------------------------------------------
    def _phases(self, cfg: CurriculumConfig) -> list[CurriculumPhase]:
        names = list(self.configured)
        if cfg.name == "constant":
            if cfg.phases:
                raise GrpoError(
                    f"curriculum.name=constant uses the weights in reward.functions and would ignore the "
                    f"{len(cfg.phases)} curriculum.phases given: add curriculum=phased to use them"
                )
            return [CurriculumPhase(until=1.0, weights={})]
        if cfg.name == "three_phase":
            return list(cfg.phases) or list(THREE_PHASE)
        if not cfg.phases:
            raise GrpoError(
                f"curriculum=phased needs its phases, e.g. on the command line {_phases_example(names)}, "
                "or a curriculum YAML of yours in --config-dir (conf/curriculum/partial_to_exact.yaml shows one)"
            )
        return list(cfg.phases)

    def _check_phases(self, phases: list[CurriculumPhase]) -> None:
        previous = 0.0
        for i, phase in enumerate(phases):
            key = f"curriculum.phases[{i}].until"
            if not (isinstance(phase.until, (int, float)) and math.isfinite(phase.until) and 0 < phase.until <= 1):
                raise _fail(key, phase.until, "must be in (0, 1], the fraction of train.steps at which the phase ends")
            if phase.until <= previous:
                raise _fail(
                    key,
                    phase.until,
                    f"must be greater than curriculum.phases[{i - 1}].until={previous} (phases in order)",
                )
            previous = phase.until
            for name, weight in phase.weights.items():
                if not (isinstance(weight, (int, float)) and math.isfinite(weight) and weight >= 0):
                    raise _fail(f"curriculum.phases[{i}].weights.{name}", weight, "must be a finite number >= 0")
        named = sorted({name for phase in phases for name in phase.weights})
        unknown = [name for name in named if name not in self.configured]
        if not unknown:
            return
        have = ", ".join(self.configured) or "nothing"
        if self.name == "three_phase":
            raise GrpoError(
                f"curriculum=three_phase is written for reward=code and weights {', '.join(named)}, but "
                f"reward.functions has {have} (missing: {', '.join(unknown)}). Use reward=code, or write phases "
                f"for your rewards: curriculum=phased {_phases_example(list(self.configured))}, or a "
                "curriculum YAML of yours in --config-dir (conf/curriculum/partial_to_exact.yaml shows one)"
            )
        where = next(i for i, phase in enumerate(phases) if any(name in phase.weights for name in unknown))
        raise GrpoError(
            f"curriculum.phases[{where}].weights: reward function(s) {', '.join(unknown)} not in reward.functions; "
            f"the phases name {', '.join(named)}, reward.functions has {have}"
        )

    # ---- the schedule -------------------------------------------------------------------------
    def progress(self, step: int) -> float:
        """p = step / total_steps for the 0-based index of the step about to run."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        return step / self.total_steps

    def phase(self, step: int) -> int:
        """Index of the phase `step` falls in: the first whose `until` is greater than p."""
        p = self.progress(step)
        return next((k for k, until in enumerate(self._bounds) if p < until), len(self._weights) - 1)

    def announcement(self, step: int, first: bool) -> str | None:
        """A line for the console and train.log when the 0-based `step` opens a phase, or is the
        `first` step this process runs (a start or a resume): which phase, from which step, and the
        weights the fusion takes now. A curriculum of one phase has nothing to announce.

        >>> from grpo_cli.config.schema import CurriculumConfig, RewardFunctionConfig
        >>> fns = [RewardFunctionConfig(name=n) for n in ("code_compiles", "code_tests", "code_style")]
        >>> curriculum = RewardCurriculum(CurriculumConfig(name="three_phase"), fns, total_steps=10)
        >>> [curriculum.announcement(s, first=False) is not None for s in range(5)]
        [False, False, True, False, False]
        >>> print(curriculum.announcement(2, first=False))  # doctest: +NORMALIZE_WHITESPACE
        curriculum three_phase: phase 2 of 3 from step 3 of 10 (20%):
        code_compiles 0.3, code_tests 0.6, code_style 0.1
        """
        if len(self._weights) == 1:
            return None
        phase = self.phase(step)
        if not first and (step == 0 or self.phase(step - 1) == phase):
            return None
        weights = ", ".join(f"{name} {weight:.3g}" for name, weight in self.weights(step).items())
        blend = f" (curriculum.interpolate=linear: {self._blend(step)})" if self.interpolate == "linear" else ""
        return (
            f"curriculum {self.name}: phase {phase + 1} of {len(self._weights)} from step {step + 1} of "
            f"{self.total_steps} ({self.progress(step):.0%}): {weights}{blend}"
        )

    def _blend(self, step: int) -> str:
        """Where `linear`'s weights go from `step` on: towards the phase whose midpoint comes next,
        reached there; past the last midpoint they hold (there is no next phase to blend towards).

        >>> from grpo_cli.config.schema import CurriculumConfig, RewardFunctionConfig
        >>> fns = [RewardFunctionConfig(name=n) for n in ("code_compiles", "code_tests", "code_style")]
        >>> curriculum = RewardCurriculum(CurriculumConfig(name="three_phase", interpolate="linear"), fns, 10)
        >>> [curriculum._blend(s) for s in (0, 2, 6, 9)]  # doctest: +NORMALIZE_WHITESPACE
        ["phase 1's weights to step 2, then blended towards phase 2's",
         "blended towards phase 2's weights, reached at step 5, then towards phase 3's",
         "blended towards phase 3's weights, reached at step 9 and held to the end",
         "phase 3's weights, held to the end"]
        """
        p, mids, last = self.progress(step), self._midpoints, len(self._midpoints) - 1
        if p >= mids[-1]:
            return f"phase {last + 1}'s weights, held to the end"
        k = next(k for k, mid in enumerate(mids) if p < mid)  # the phase whose weights come next

        def reached(k: int) -> int:  # 1-based: the first step whose progress is at phase k's midpoint
            return math.ceil(mids[k] * self.total_steps - 1e-9) + 1

        if k == 0:
            return f"phase 1's weights to step {reached(0)}, then blended towards phase 2's"
        if reached(k) > self.total_steps:  # a last midpoint within the run's final step
            return f"blended towards phase {k + 1}'s weights, not reached by the end"
        then = " and held to the end" if k == last else f", then towards phase {k + 2}'s"
        return f"blended towards phase {k + 1}'s weights, reached at step {reached(k)}{then}"

    def weights(self, step: int) -> dict[str, float]:
        """{function name: weight} for the 0-based step about to run, every configured function named.

        >>> from grpo_cli.config.schema import CurriculumConfig, RewardFunctionConfig
        >>> fns = [RewardFunctionConfig(name=n, weight=0.2) for n in ("code_compiles", "code_tests", "code_style")]
        >>> curriculum = RewardCurriculum(CurriculumConfig(name="three_phase"), fns, total_steps=10)
        >>> [curriculum.weights(s)["code_compiles"] for s in (1, 2, 6)]
        [0.7, 0.3, 0.1]
        """
        if self.interpolate == "step" or len(self._weights) == 1:
            return dict(self._weights[self.phase(step)])
        p, mids = self.progress(step), self._midpoints
        if p <= mids[0]:
            return dict(self._weights[0])
        if p >= mids[-1]:
            return dict(self._weights[-1])
        k = next(k for k in range(len(mids) - 1) if p <= mids[k + 1])
        t = (p - mids[k]) / (mids[k + 1] - mids[k])
        lo, hi = self._weights[k], self._weights[k + 1]
        return {name: lo[name] + t * (hi[name] - lo[name]) for name in lo}
