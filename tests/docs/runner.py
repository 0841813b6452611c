"""Runs a plan of `grpo` commands as a reader runs them, cheaply: one process imports torch,
transformers and grpo once (about 4 s of CPU, most of a small command's cost), then forks a fresh
child for each command, so every command starts from the same clean state and none pays the imports.

    python -m tests.docs.runner PLAN.json RESULTS.json

PLAN.json: {"workers": 2, "steps": [{"id", "argv", "cwd", "needs": [ids], "log"}]}. A step starts
once every step it needs has finished with exit 0 (it is not run, and says why, when one failed);
at most `workers` run at once. RESULTS.json: {id: {"rc", "seconds", "why"}}.

The parent never runs a torch op before forking: a forked child of a process whose OpenMP pool
already spun up can hang, one that only imported torch cannot.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import time
from pathlib import Path

CHECKPOINT = re.compile(r"^(?P<key>[\w.]+=)?(?P<run>.+)/checkpoints/step_\d+$")


def preload() -> None:
    """What the subcommands import lazily, imported once here for every child to inherit."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # as tests/conftest.py: nothing leaves the machine
    import matplotlib

    matplotlib.use("Agg")
    import grpo_cli.cli  # noqa: F401
    import grpo_cli.commands.entry  # noqa: F401
    from grpo_cli.commands import SUBCOMMANDS

    for sub in SUBCOMMANDS:
        sub.load()


def newest_checkpoint(arg: str, cwd: Path) -> str:
    """`RUN/checkpoints/step_000300` as a page writes it, where the page's run was a 2-step smoke run:
    RUN's newest checkpoint. Any other argument, and a checkpoint that exists, stay as written."""
    match = CHECKPOINT.match(arg)
    if match is None or (cwd / arg.split("=", 1)[-1]).exists():
        return arg
    saved = sorted((cwd / match["run"] / "checkpoints").glob("step_*"))
    return f"{match['key'] or ''}{match['run']}/checkpoints/{saved[-1].name}" if saved else arg


def run_child(step: dict) -> None:
    """In the forked child: the command's output to its log, its exit status as the child's."""
    log = os.open(step["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    code = 1
    try:
        cwd = Path(step["cwd"])
        os.chdir(cwd)
        argv = [newest_checkpoint(arg, cwd) for arg in step["argv"]]
        print(f"ran as: grpo {shlex.join(argv)}", file=sys.stderr, flush=True)
        from grpo_cli.cli import main

        main(argv)
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:  # a traceback is a failure the log must show
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def run_plan(plan: dict) -> dict[str, dict]:
    steps, workers = list(plan["steps"]), plan.get("workers", 2)
    results: dict[str, dict] = {}
    running: dict[int, tuple[dict, float]] = {}
    while steps or running:
        for step in list(steps):
            if len(running) >= workers:
                break
            if any(need not in results for need in step["needs"]):
                continue  # an earlier command it reads is still running
            steps.remove(step)
            failed = [need for need in step["needs"] if results[need]["rc"] != 0]
            if failed:
                why = f"not run: it reads {failed[0]}, which failed"
                results[step["id"]] = {"rc": None, "seconds": 0.0, "why": why}
                continue
            pid = os.fork()
            if pid == 0:
                run_child(step)
            running[pid] = (step, time.monotonic())
        if running:
            pid, status = os.wait()
            step, started = running.pop(pid)
            results[step["id"]] = {"rc": os.waitstatus_to_exitcode(status), "seconds": time.monotonic() - started}
    return results


if __name__ == "__main__":
    plan_file, results_file = map(Path, sys.argv[1:3])
    # Read when torch loads OpenMP, so before preload: two commands at once on 2 cores, and one's
    # spinning idle threads would steal the other's core (a fifth of this plan's CPU time).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    preload()
    Path(results_file).write_text(json.dumps(run_plan(json.loads(plan_file.read_text()))))
