"""Throughput and peak memory of `grpo score` on a synthetic rollouts file.

    python benchmarks/score_stream.py --completions 100000 --group-size 8

Writes the file, runs `grpo score` in a subprocess (as a user would) and reports wall time,
completions/s and the child's peak RSS, for two batch sizes: memory must not grow with the file.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def write_rollouts(path: Path, completions: int, group_size: int) -> None:
    rng = random.Random(0)
    with path.open("w") as handle:
        for i in range(completions // group_size):
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            texts = [str(a + b + rng.choice([0, 0, 1, -1])) for _ in range(group_size)]
            row = {
                "prompt": f"{a}+{b}=",
                "answer": str(a + b),
                "id": i,
                "completions": [{"text": t, "token_count": len(t) + 1, "finish_reason": "stop"} for t in texts],
            }
            handle.write(json.dumps(row) + "\n")


def run(input_path: Path, output: Path, batch_size: int) -> dict[str, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_cli",
            "score",
            f"input={input_path}",
            f"output={output}",
            "reward=arithmetic",
            f"batch_size={batch_size}",
        ],
        check=True,
        capture_output=True,
    )
    wall = time.perf_counter() - start
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"wall_s": wall, "peak_rss_mb": max(peak_kb, before) / 1024}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--completions", type=int, default=100_000)
    parser.add_argument("--group-size", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rollouts = Path(tmp) / "rollouts.jsonl"
        write_rollouts(rollouts, args.completions, args.group_size)
        size_mb = rollouts.stat().st_size / 2**20
        print(f"{args.completions} completions, {size_mb:.1f} MiB of jsonl")
        for batch_size in (64, 512):
            figures = run(rollouts, Path(tmp) / "scored.jsonl", batch_size)
            rate = args.completions / figures["wall_s"]
            # ru_maxrss of children is the max over all children so far: run the small batch first
            print(
                f"batch_size={batch_size}: {figures['wall_s']:.1f} s, {rate:,.0f} completions/s, "
                f"peak RSS (max so far) {figures['peak_rss_mb']:.0f} MiB"
            )


if __name__ == "__main__":
    main()
