"""What one sandboxed session costs, start to end, on each backend, pre-warmed and one-shot.

    python benchmarks/sandbox_session.py [--sessions 200]

A session here is what `code_tests` does per completion for a function task: start a fresh
sandboxed process, import a small candidate, make one call, end it and clean up. The figure is the
median wall time over `--sessions` sessions run one after another (after 10 unmeasured ones), so
it is the harness's own cost: an honest completion's calls add well under a millisecond.
"""

from __future__ import annotations

import argparse
import statistics
import time

from grpo_cli.rewards.code import HarnessFault, Sandbox, SandboxConfig

SOURCE = "def add(a, b):\n    return a + b\n"


def session_ms(box: Sandbox, sessions: int) -> list[float]:
    times = []
    for _ in range(sessions + 10):
        start = time.perf_counter()
        with box.session(SOURCE, "add") as s:
            assert s.call(1, 2) == 3
        times.append((time.perf_counter() - start) * 1000)
    return times[10:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=200, help="measured sessions per backend and mode")
    args = parser.parse_args()
    print("| backend | pre-warmed: median ms | p95 ms | one-shot: median ms | p95 ms | ratio |")
    print("|---|---|---|---|---|---|")
    for backend in ("bwrap", "unshare", "process"):
        figures = {}
        for prewarm in (True, False):
            try:
                # workers=1: sessions here run one after another
                with Sandbox(SandboxConfig(backend=backend, timeout_s=5, workers=1, prewarm=prewarm)) as box:
                    times = sorted(session_ms(box, args.sessions))
            except HarnessFault as err:
                print(f"| {backend} | unavailable: {str(err)[:80]} | | | | |")
                break
            figures[prewarm] = (statistics.median(times), times[round(0.95 * (len(times) - 1))])
        else:
            (warm, warm95), (cold, cold95) = figures[True], figures[False]
            print(f"| {backend} | {warm:.1f} | {warm95:.1f} | {cold:.1f} | {cold95:.1f} | {cold / warm:.1f}x |")


if __name__ == "__main__":
    main()
