"""The fastest a `grpo train` step could be at fp32 on this CPU: the time of its matrix multiplies alone.

    python benchmarks/matmul_floor.py                    # the small workload of vs_trl.py, 1 thread
    python benchmarks/matmul_floor.py --workload tiny --identical-work

Why: issue 13 asks for half of TRL's step time. A step cannot take less time than the matrix
multiplies it must execute, however little else it does. This runs the workload of
`benchmarks/vs_trl.py` (same model, same settings) for a few warm-up steps, records every
`aten::mm`/`aten::addmm`/`aten::bmm` of the next steps with its shapes (torch.profiler), then
times each shape alone, on contiguous random inputs, as many times as a step calls it. It prints:

    mm GFLOP/step     the FLOPs of those multiplies per step (2·m·k·n each)
    floor s           the same multiplies timed alone: a step with zero overhead
    step s            the median unprofiled step of the same trainer, measured right after
    floor / step      the share of the step that is irreducible arithmetic at these shapes

Compare `floor s` with TRL's step from `vs_trl.py` measured in the same hour: when the floor is
close to half of TRL's step, no amount of overhead removal reaches 0.5x; only fewer FLOPs (a
different algorithm or lower precision) can.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import vs_trl  # noqa: E402  (the workloads and settings: one definition)

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm")


def median_seconds(fn, repeats: int = 20) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def isolated_seconds(op: str, shapes: list[list[int]]) -> tuple[float, float]:
    """(seconds, FLOPs) of one call of `op` on random contiguous inputs of these shapes."""
    import torch

    if op == "aten::addmm":  # (bias, a, b)
        bias, a, b = (torch.randn(*s) for s in shapes[:3])
        return median_seconds(lambda: torch.addmm(bias, a, b)), 2.0 * a.size(0) * a.size(1) * b.size(1)
    a, b = torch.randn(*shapes[0]), torch.randn(*shapes[1])
    fn = torch.bmm if op == "aten::bmm" else torch.mm
    batch = a.size(0) if op == "aten::bmm" else 1
    return median_seconds(lambda: fn(a, b)), 2.0 * batch * a.size(-2) * a.size(-1) * b.size(-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="small", choices=sorted(vs_trl.WORKLOADS))
    parser.add_argument("--steps", type=int, default=5, help="profiled steps (after 3 warm-up steps)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--identical-work", action="store_true", help="every completion max new tokens long")
    args = parser.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    from grpo_cli.training.trainer import GRPOTrainer

    torch.set_num_threads(args.threads)
    workload = vs_trl.WORKLOADS[args.workload]
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, run_dir = Path(tmp) / "model", Path(tmp) / "run"
        vs_trl.build_model(model_dir, workload)
        spec = vs_trl.RunSpec(
            "grpo", workload, 0, 3 + 2 * args.steps, args.threads, args.identical_work, str(model_dir), str(run_dir), ""
        )
        trainer = GRPOTrainer(vs_trl.grpo_config(spec), run_dir, observers=[])
        trainer.setup()
        for _ in range(3):
            trainer.step()
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            for _ in range(args.steps):
                trainer.step()
        steps = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            trainer.step()
            steps.append(time.perf_counter() - t0)
        floor = flops = 0.0
        for event in prof.key_averages(group_by_input_shape=True):
            if event.key in MATMUL_OPS:
                seconds, op_flops = isolated_seconds(event.key, event.input_shapes)
                floor += seconds * event.count / args.steps
                flops += op_flops * event.count / args.steps
        step = statistics.median(steps)
    peak = vs_trl.matmul_peak_gflops(args.threads)
    print(f"{args.workload}, {args.threads} thread(s), identical work: {args.identical_work}")
    print(f"mm GFLOP/step {flops / 1e9:.2f}  floor s {floor:.3f}  step s {step:.3f}  floor / step {floor / step:.2f}")
    print(f"fp32 matmul peak {peak:.1f} GFLOP/s; the step's multiplies alone run at {flops / floor / 1e9:.1f}")


if __name__ == "__main__":
    main()
