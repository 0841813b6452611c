"""`grpo SUBCOMMAND [hydra args]`: dispatch only, over the subcommand table."""

from __future__ import annotations

import difflib
import os
import signal
import sys
import threading

from grpo_cli import __version__
from grpo_cli.commands import BY_NAME, SUBCOMMANDS

USAGE = "usage: grpo SUBCOMMAND [overrides] [hydra options]"


def _print_help() -> None:
    print(f"grpo {__version__}: GRPO post-training of causal language models\n\n{USAGE}\n\nsubcommands:")
    for sub in SUBCOMMANDS:
        print(f"  {sub.name:<10} {sub.help}")
    print("\n`grpo SUBCOMMAND --help` lists its config groups and keys; `grpo SUBCOMMAND --keys [PREFIX]` gives")
    print("each key's type, default and meaning (the same as docs/reference.md).")


def launched_by_accelerate() -> bool:
    """A process of a user's `accelerate launch grpo train ...` (and not one of our own workers,
    which read the run directory's config instead)."""
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return False
    from grpo_cli.commands.launch import WORKER_ENV

    return WORKER_ENV not in os.environ


def check_one_of_several() -> None:
    """accelerate's simple launcher (`accelerate launch --cpu`, or a launch with no GPU and no config)
    starts one process whatever --num_processes says (more need MPI); asked for more, it sets
    MASTER_ADDR but no WORLD_SIZE. The run would train alone, as if it had been asked to."""
    if "ACCELERATE_USE_CPU" in os.environ and "MASTER_ADDR" in os.environ and "WORLD_SIZE" not in os.environ:
        from grpo_cli.errors import GrpoError

        raise GrpoError(
            "accelerate launch asked for several processes (--num_processes) but started this one only: its "
            "--cpu launcher (also the one without GPUs) needs MPI for more. Use accelerate launch --multi_gpu "
            "--num_processes N -m grpo_cli train (grpo uses gloo without CUDA), torchrun, or grpo train "
            "distributed.num_processes=N train.device=cpu"
        )


def main(argv: list[str] | None = None) -> None:
    """`grpo`: a Ctrl-C that no command handles itself (Hydra composing, torch importing) is one
    line and 130; once a command has returned, a Ctrl-C would only cut the interpreter's teardown
    and turn finished work into 130, so it is ignored from there."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        _dispatch(argv)
    except KeyboardInterrupt:
        print(f"interrupted: grpo {argv[0] if argv else ''} stopped; nothing more was done", file=sys.stderr)
        sys.exit(130)
    if threading.current_thread() is threading.main_thread():  # where signal handlers live
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _dispatch(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help"):
        _print_help()
        sys.exit(0 if argv else 2)
    if argv[0] == "--version":
        print(__version__)
        return
    name, rest = argv[0], argv[1:]
    if name not in BY_NAME:
        close = difflib.get_close_matches(name, BY_NAME, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        print(f"grpo: unknown subcommand '{name}'{hint}\n{USAGE}", file=sys.stderr)
        sys.exit(2)
    if BY_NAME[name].schema is None:  # a plain argparse command: no Hydra, no overrides to check
        BY_NAME[name].load()(rest)
        return
    from grpo_cli.commands.entry import hydra_entry_point
    from grpo_cli.commands.errors import report_user_errors
    from grpo_cli.commands.overrides import check_overrides
    from grpo_cli.commands.run_lock import explicit_run_dir, lock_run_dir

    sub = BY_NAME[name]
    if "--keys" in rest:  # the configuration reference for this command, or the keys under one prefix
        from grpo_cli.config.reference import print_keys

        at = rest.index("--keys")
        sys.exit(print_keys(sub.schema, rest[at + 1] if at + 1 < len(rest) else ""))
    if name == "train":
        report_user_errors(check_one_of_several)
    if name == "train" and launched_by_accelerate() and int(os.environ.get("RANK", "0")) != 0:
        from grpo_cli.commands.launch import follow_main_process

        report_user_errors(follow_main_process)  # the main process composes; this one trains its share
        return
    if name == "train":  # a TRL GRPOConfig file becomes overrides before anything checks them
        from grpo_cli.commands.trl_config import expand_trl_config

        rest = report_user_errors(lambda: expand_trl_config(rest))
    report_user_errors(lambda: check_overrides(rest, sub.schema))
    run_dir = report_user_errors(lambda: explicit_run_dir(rest)) if sub.locks_run_dir else None
    if run_dir is not None:
        report_user_errors(lambda: lock_run_dir(run_dir))  # before Hydra writes .hydra/ and the log into it
    sys.argv = [f"grpo-{name}", *rest]
    hydra_entry_point(sub)()
