"""Peak memory of full fine-tuning against LoRA, with and without the KL reference (algo.beta).

    python benchmarks/lora_memory.py [--hidden-size 1024 --num-layers 8 --intermediate-size 4096]

Runs `grpo train` in a subprocess (as a user would) on a widened tiny model, so the weights
dominate the process's memory, for four settings: full fine-tuning and LoRA, each at algo.beta=0
(no reference) and 0.04. Full fine-tuning's reference is a frozen copy of the weights; LoRA's is
the same base weights with the adapters switched off, so it should cost nothing. Prints a
markdown table of each run's peak resident set (`memory/peak_mib` of its last metrics line: on
CPU the process's peak RSS) and wall time. Every run starts from the same saved base model.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import transformers

from grpo_cli.config.schema import TinyModelConfig
from grpo_cli.models import build_tiny_model

transformers.utils.logging.disable_progress_bar()

SETTINGS = {  # name -> overrides
    "full, beta=0": ["algo.beta=0"],
    "full, beta=0.04": ["algo.beta=0.04"],
    "LoRA, beta=0": ["algo.beta=0", "model.lora.enabled=true"],
    "LoRA, beta=0.04": ["algo.beta=0.04", "model.lora.enabled=true"],
}


def parameters(size: TinyModelConfig, vocab: int = 259) -> int:
    """Llama with tied embeddings: embeddings, per layer 4 attention and 3 MLP matrices and 2 norms, final norm."""
    h, i = size.hidden_size, size.intermediate_size
    return vocab * h + size.num_layers * (4 * h * h + 3 * h * i + 2 * h) + h


def train(model_dir: Path, size: TinyModelConfig, overrides: list[str], args: argparse.Namespace, run_dir: Path):
    start = time.perf_counter()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_cli",
            "train",
            "model=hf",  # the tiny model built once, loaded as a model directory (model=tiny refuses model.path)
            f"model.path={model_dir}",
            f"train.steps={args.steps}",
            f"train.prompts_per_step={args.prompts_per_step}",
            f"train.threads={args.threads}",
            "rollout.num_generations=4",
            "monitor.console=quiet",
            "monitor.plots=false",
            "monitor.log_completions_every=0",
            f"hydra.run.dir={run_dir}",
            *overrides,
        ],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise SystemExit(f"grpo train {' '.join(overrides)} failed:\n{result.stderr[-3000:]}")
    wall = time.perf_counter() - start
    last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    return last["memory/peak_mib"], wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden-size", type=int, default=1024)
    parser.add_argument("--num-layers", type=int, default=8)
    parser.add_argument("--num-heads", type=int, default=16)
    parser.add_argument("--intermediate-size", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps: Adam's moments exist after the first")
    parser.add_argument("--prompts-per-step", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    size = TinyModelConfig(
        hidden_size=args.hidden_size,
        num_layers=args.num_layers,
        num_heads=args.num_heads,
        intermediate_size=args.intermediate_size,
    )
    weights_mib = parameters(size) * 4 / 2**20
    print(f"model: {parameters(size) / 1e6:.1f}M parameters, {weights_mib:.0f} MiB in fp32\n")
    print("| setting | peak RSS MiB | over full beta=0 | wall s |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(Path(tmp) / "model", size, seed=0)  # one base for every run
        baseline = None
        for name, overrides in SETTINGS.items():
            run_dir = Path(tmp) / name.replace(", beta=", "_beta")  # no '=' in an override's value
            peak, wall = train(model_dir, size, overrides, args, run_dir)
            baseline = peak if baseline is None else baseline
            print(f"| {name} | {peak:.0f} | {peak - baseline:+.0f} | {wall:.1f} |", flush=True)


if __name__ == "__main__":
    main()
