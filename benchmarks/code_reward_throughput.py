"""Throughput and latency of `code_tests` (the sandboxed unit-test reward) on this machine.

    python benchmarks/code_reward_throughput.py [--timeout-s 1.0] [--repeat 2]

For every backend whose start-up probe passes here (bwrap, unshare, process), with 1 and 2
workers, with pre-warmed runners (the default: each completion forked from a runner started once)
and without (`prewarm=false`: the backend and an interpreter started per completion), it scores
two mixes of completions for the shipped code tasks and prints a markdown table of completions/s
and per-completion latency (p50, p95):

- honest: each task's reference solution, `--repeat` times (every one must score 1.0);
- hostile: infinite loops, sleeps, stdout floods and memory bombs, cycled over the tasks (every
  one must score 0.0, never None). A hostile completion costs about `--timeout-s`.

Each completion is one `code_tests` call, `workers` of them at once on threads, which is what a
batch call does inside (one fresh sandboxed process per completion).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from importlib.resources import files

from grpo_cli.rewards.code.batch import close_sandboxes, sandbox_backend
from grpo_cli.rewards.code.sandbox import HarnessFault
from grpo_cli.rewards.code.sandboxed_rewards import TASK_COLUMNS, code_tests

HOSTILE_BODIES = {  # function tasks get these as the body; stdin/stdout tasks as the program (dedented)
    "infinite loop": "    while True:\n        pass\n",
    "sleep": "    import time\n    time.sleep(600)\n",
    "stdout flood": "    while True:\n        print('x' * 4096)\n",
    "memory bomb": "    hog = []\n    while True:\n        hog.append(bytearray(16 * 1024 * 1024))\n",
}


def load_tasks() -> list[dict]:
    text = (files("grpo_cli.data") / "code_tasks.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def honest_mix(tasks: list[dict], repeat: int) -> list[tuple[dict, str]]:
    return [(task, task["reference"]) for _ in range(repeat) for task in tasks]


def hostile_mix(tasks: list[dict], per_kind: int) -> list[tuple[dict, str]]:
    mix = []
    for k, body in enumerate(HOSTILE_BODIES.values()):
        for j in range(per_kind):
            task = tasks[(k * per_kind + j) * 7 % len(tasks)]  # spread over all three test shapes
            program = body if task["entry_point"] else "\n".join(line[4:] for line in body.splitlines()) + "\n"
            mix.append((task, program))
    return mix


def score_one(task: dict, completion: str, settings: dict) -> tuple[float | None, float]:
    start = time.perf_counter()
    columns = {k: [task.get(k)] for k in TASK_COLUMNS}
    (score,) = code_tests([task["prompt"]], [completion], **columns, **settings)
    return score, time.perf_counter() - start


def measure(mix: list[tuple[dict, str]], settings: dict, workers: int) -> dict:
    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(lambda item: score_one(*item, settings), mix))
    wall = time.perf_counter() - start
    latencies = sorted(latency for _, latency in results)
    return {
        "scores": [score for score, _ in results],
        "rate": len(mix) / wall,
        "p50": statistics.median(latencies),
        "p95": latencies[min(len(latencies) - 1, round(0.95 * (len(latencies) - 1)))],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout-s", type=float, default=1.0, help="sandbox wall clock per completion")
    parser.add_argument("--repeat", type=int, default=2, help="copies of each reference in the honest mix")
    parser.add_argument("--hostile-per-kind", type=int, default=4, help="hostile completions of each kind")
    parser.add_argument("--backends", nargs="+", default=["bwrap", "unshare", "process"], help="backends to measure")
    parser.add_argument("--honest-only", action="store_true", help="skip the hostile mix")
    args = parser.parse_args()
    tasks = load_tasks()
    mixes = {"honest": honest_mix(tasks, args.repeat), "hostile": hostile_mix(tasks, args.hostile_per_kind)}
    expected = {"honest": 1.0, "hostile": 0.0}
    print(
        f"timeout_s={args.timeout_s}, memory_mb=512; honest: {len(mixes['honest'])} references of "
        f"{len(tasks)} tasks; hostile: {', '.join(HOSTILE_BODIES)} x {args.hostile_per_kind}\n"
    )
    print(
        "| backend | prewarm | workers | mix | completions | completions/s | p50 latency (ms) | p95 latency (ms) "
        "| scores ok |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for backend in args.backends:
        for prewarm in (True, False):
            for workers in (1, 2):
                settings = {"backend": backend, "timeout_s": args.timeout_s, "workers": workers, "prewarm": prewarm}
                try:
                    sandbox_backend(**settings)  # probe (and pre-warm) once, outside the timings
                except HarnessFault as err:
                    print(f"| {backend} | {prewarm} | {workers} | - | - | - | - | - | unavailable: {str(err)[:80]} |")
                    break
                for name, mix in mixes.items():
                    if name == "hostile" and args.honest_only:
                        continue
                    figures = measure(mix, settings, workers)
                    ok = sum(score == expected[name] for score in figures["scores"])
                    print(
                        f"| {backend} | {prewarm} | {workers} | {name} | {len(mix)} | {figures['rate']:.1f} | "
                        f"{figures['p50'] * 1000:.0f} | {figures['p95'] * 1000:.0f} | {ok}/{len(mix)} |"
                    )
                close_sandboxes()


if __name__ == "__main__":
    main()
