"""What this machine can do at best on the real-model step, and how far each half of a step is from it.

    python benchmarks/floors.py                               # the floors of SmolLM2-135M, 2 threads
    python benchmarks/floors.py --runs vs_fp32.json vs_bf16.json   # + each half of those steps against them

Why: issue 39 asks for a third of TRL's step. A step has two halves bound by different limits, and a
speed-up is only worth chasing where the half is far above its limit:

- decoding one token for a handful of rows multiplies every weight matrix by a few vectors: it reads
  each weight once and is bound by memory bandwidth (bf16 weights halve the bytes, int8 quarter them);
- the training passes (the policy's forward and backward, the reference's and the old policy's
  forwards: 10·P·T FLOPs, benchmarks/vs_trl.py) are matrix multiplies of thousands of rows: bound by
  the matmul peak of the compute dtype.

It measures, at `--threads`: the memory read bandwidth (one sum over a 512 MiB tensor); the fp32,
bf16 and int8 matmul peaks on square products (torch.mm, torch._int_mm for int8); and the decode
step's floor per dtype: the model's own linear layers, every one a separate weight so nothing
stays in cache, multiplied by `--rows` vectors in layer order (the LM head included, attention and
the rest left out). With `--runs` (benchmarks/vs_trl.py --json outputs) it prints each framework's
generation and training time per step as a multiple of those floors: generation against the mean
completion length x the decode floor of the dtype that sampled, the rest against 10·P·T at the
matmul peak of the dtype that trained.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import vs_trl  # noqa: E402  (the workloads and the model's conversion: one definition)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": torch.int8}


def median_seconds(fn: Any, repeats: int = 7) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def read_bandwidth_gbs() -> float:
    data = torch.ones(128 * 2**20)  # 512 MiB of fp32: far past any cache
    return data.numel() * 4 / median_seconds(data.sum) / 1e9


def matmul_peak_gflops(dtype: str, sizes: tuple[int, ...] = (1024, 2048)) -> float:
    """Best GFLOP/s (2·n³ per n x n product; int8 counts multiply-adds the same way)."""
    best = 0.0
    for n in sizes:
        if dtype == "int8":
            a = torch.randint(-64, 64, (n, n), dtype=torch.int8)
            b = torch.randint(-64, 64, (n, n), dtype=torch.int8)
            seconds = median_seconds(lambda a=a, b=b: torch._int_mm(a, b), 5)
        else:
            a, b = torch.randn(n, n, dtype=DTYPES[dtype]), torch.randn(n, n, dtype=DTYPES[dtype])
            seconds = median_seconds(lambda a=a, b=b: a @ b, 5)
        best = max(best, 2 * n**3 / seconds / 1e9)
    return best


def linear_shapes(config: dict[str, Any]) -> list[tuple[int, int]]:
    """(in, out) of every weight matrix one decoded token multiplies, in order: a Llama's q, k, v, o,
    gate, up, down per layer, then the LM head."""
    hidden, inner = config["hidden_size"], config["intermediate_size"]
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    layer = [
        (hidden, heads * head_dim),
        (hidden, kv * head_dim),
        (hidden, kv * head_dim),
        (heads * head_dim, hidden),
        (hidden, inner),
        (hidden, inner),
        (inner, hidden),
    ]
    return layer * config["num_hidden_layers"] + [(hidden, config["vocab_size"])]


def decode_floor_s(shapes: list[tuple[int, int]], rows: int, dtype: str) -> tuple[float, int]:
    """Seconds for one decode step's multiplies with `rows` vectors, weights streamed from memory, and
    the weights' bytes."""
    if dtype == "int8":  # torch._int_mm wants more than 16 rows: pad to 17, the bytes read are the same
        weights = [torch.randint(-64, 64, (k, n), dtype=torch.int8) for k, n in shapes]
        inputs = {k: torch.randint(-64, 64, (max(rows, 17), k), dtype=torch.int8) for k, _ in shapes}

        def step() -> None:
            for w in weights:
                torch._int_mm(inputs[w.size(0)], w)
    else:
        weights = [torch.randn(n, k, dtype=DTYPES[dtype]) for k, n in shapes]
        inputs = {k: torch.randn(rows, k, dtype=DTYPES[dtype]) for k, _ in shapes}

        def step() -> None:
            for w in weights:
                torch.nn.functional.linear(inputs[w.size(1)], w)

    return median_seconds(step, 5), sum(w.numel() * w.element_size() for w in weights)


def measure(threads: int, rows: int, config: dict[str, Any]) -> dict[str, Any]:
    torch.set_num_threads(threads)
    shapes = linear_shapes(config)
    floors: dict[str, Any] = {"threads": threads, "rows": rows, "read_gbs": read_bandwidth_gbs()}
    for dtype in DTYPES:
        seconds, weight_bytes = decode_floor_s(shapes, rows, dtype)
        floors[dtype] = {
            "matmul_peak_gflops": matmul_peak_gflops(dtype),
            "decode_step_s": seconds,
            "weight_mib": weight_bytes / 2**20,
            "decode_gbs": weight_bytes / seconds / 1e9,
            "bandwidth_step_s": weight_bytes / (floors["read_gbs"] * 1e9),
        }
    return floors


def half_multiples(floors: dict[str, Any], raw: dict[str, Any]) -> list[dict[str, Any]]:
    """Each framework of a vs_trl.py --json output: its generation and training halves per step
    against the floors of the dtypes it sampled and trained in."""
    rows = []
    for name, frameworks in raw["summary"].items():
        for framework, summary in frameworks.items():
            run = next(r for r in raw["runs"] if r["framework"] == framework and r["workload"] == name)
            notes = run["notes"]
            ours = next(r for r in raw["runs"] if r["framework"] == "grpo" and r["workload"] == name)
            trained = notes.get("precision", ours["notes"].get("precision", "fp32"))  # --precision: both
            if framework == "trl":
                sampled = "fp32"  # TRL's generate runs the fp32 weights, autocast or not
            else:
                copy = str(notes.get("sampling_weights") or "").startswith("a bf16 copy")
                sampled = "bf16" if copy else "fp32"
            decode_floor = summary["completion_len_mean"] * floors[sampled]["decode_step_s"]
            train_floor = summary["needed_gflop_median"] / floors[trained]["matmul_peak_gflops"]
            rows.append(
                {
                    "framework": framework,
                    "trained": trained,
                    "sampled": sampled,
                    "step_s": summary["step_s_median"],
                    "generate_s": summary["generate_s_median"],
                    "generate_floor_s": decode_floor,
                    "rest_s": summary["rest_s_median"],
                    "rest_floor_s": train_floor,
                }
            )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="smollm2", choices=sorted(vs_trl.WORKLOADS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, default=16, help="decoded rows: prompts x completions per step")
    parser.add_argument("--model-cache", default=vs_trl.ModelConfig().cache_dir)
    parser.add_argument("--runs", type=Path, nargs="*", default=[], help="benchmarks/vs_trl.py --json outputs")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    workload = vs_trl.WORKLOADS[args.workload]
    if workload.model is None:
        parser.error("the floors are the real model's: --workload smollm2")
    vs_trl.check_real_model(workload)
    config = json.loads((vs_trl.real_model_directory(workload, args.model_cache) / "config.json").read_text())
    floors = measure(args.threads, args.rows, config)
    print(f"memory read: {floors['read_gbs']:.1f} GB/s ({args.threads} threads)")
    print("| dtype | matmul peak GFLOP/s | decode step floor ms | weights MiB | GB/s reached | at read bandwidth ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    for dtype in DTYPES:
        f = floors[dtype]
        print(
            f"| {dtype} | {f['matmul_peak_gflops']:.0f} | {f['decode_step_s'] * 1e3:.1f} | {f['weight_mib']:.0f} "
            f"| {f['decode_gbs']:.1f} | {f['bandwidth_step_s'] * 1e3:.1f} |"
        )
    halves = [row for path in args.runs for row in half_multiples(floors, json.loads(path.read_text()))]
    if halves:
        print()
        print("| framework | trains | samples | step s | generation s | x its floor | the rest s | x its floor |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for h in halves:
            print(
                f"| {h['framework']} | {h['trained']} | {h['sampled']} | {h['step_s']:.2f} | {h['generate_s']:.2f} "
                f"| {h['generate_s'] / h['generate_floor_s']:.1f} | {h['rest_s']:.2f} "
                f"| {h['rest_s'] / h['rest_floor_s']:.1f} |"
            )
    if args.json is not None:
        args.json.write_text(json.dumps({"floors": floors, "halves": halves}, indent=2))


if __name__ == "__main__":
    main()
