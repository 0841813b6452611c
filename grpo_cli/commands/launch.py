"""`grpo train distributed.num_processes=N`: one composed config, one run directory, N workers.

The command composes the config once (Hydra, in this process), writes the resolved file into the
run directory, and starts the workers on it with accelerate's launcher (torchrun underneath: gloo
on CPU, nccl on CUDA). Each worker reads that file (`python -m grpo_cli.commands.launch RUN_DIR`),
so every process trains exactly the same config in the same directory.

A user's own `accelerate launch $(which grpo) train ...` takes the other way in: the main process
composes with Hydra as usual and sends (config, run directory) to the others, which skip Hydra
(`follow_main_process`), so there is still one composition and one run directory.

Ctrl-C and SIGTERM (a cluster's preemption) sent to `grpo train` are passed on to the launcher,
which passes them to the workers (torchrun starts each in a session of its own, so nothing else
reaches them); `grpo train` waits while they save the step they finish, then prints the resume
command (`training/interrupt.py`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import logging.config
import math
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import torch
from omegaconf import OmegaConf

from grpo_cli.config import TrainConfig
from grpo_cli.config.train_checks import validate
from grpo_cli.errors import GrpoError
from grpo_cli.training.distributed import World, check_divisible, launched_processes
from grpo_cli.training.interrupt import STOP_SIGNALS, Interrupted, exit_code

WORKER_ENV = "GRPO_WORKER_RUN_DIR"  # set by `launch_workers`: the workers read the run directory's config
CONFIG_FILE = "config.yaml"
AGENT = "--agent"  # `python -m grpo_cli.commands.launch --agent ARGS`: accelerate's launcher, run by `run_agent`
# torchrun's wait for the workers after passing a signal on, before it SIGKILLs them. Its default
# (30 s) cuts a real model's step and checkpoint short; the cluster's own SIGKILL is the bound
# that matters. TORCH_ELASTIC_SHUTDOWN_TIMEOUT in the environment overrides it.
SHUTDOWN_GRACE_S = 300
SIGNAL_EXITS = {exit_code(Interrupted(signum)): signum for signum in STOP_SIGNALS}  # a worker's code after a stop
# ... or the code of a worker that torchrun signalled once it had stopped (a negative returncode: killed by it)
STOPPED_WORKER = {*SIGNAL_EXITS, *(-signum for signum in STOP_SIGNALS)}


def write_resolved_config(cfg: TrainConfig, run_dir: Path, header: str = "") -> Path:
    """The config every process trains, as one YAML file in the run directory."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / CONFIG_FILE
    body = OmegaConf.to_yaml(OmegaConf.structured(cfg))
    path.write_text(f"{header}{body}", encoding="utf-8")
    return path


def read_resolved_config(run_dir: Path) -> TrainConfig:
    path = run_dir / CONFIG_FILE
    if not path.exists():
        raise GrpoError(f"{path}: no resolved config to train (written by grpo train distributed.num_processes=N)")
    merged = OmegaConf.merge(OmegaConf.structured(TrainConfig), OmegaConf.load(path))
    return OmegaConf.to_object(merged)


def uses_cpu(device: str) -> bool:
    """Workers train on the CPU (gloo) when asked to or when there is no CUDA device."""
    return device == "cpu" or not torch.cuda.is_available()


def launch_uses_cpu() -> bool:
    """Inside a launch every process must pick the same backend before any config is shared:
    the launcher's flag (ours sets it for train.device=cpu; `accelerate launch --cpu` too) or no CUDA."""
    return os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true") or not torch.cuda.is_available()


def launch_command(cfg: TrainConfig, run_dir: Path) -> list[str]:
    dist = cfg.distributed
    command = [sys.executable, "-m", "grpo_cli.commands.launch", AGENT]  # accelerate's launcher (`run_agent`)
    if dist.accelerate_config:
        command += ["--config_file", dist.accelerate_config]
    else:  # torchrun on this machine; on CPU too (accelerate's --cpu launcher wants MPI for N > 1)
        command += ["--multi_gpu", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    command += ["--num_processes", str(dist.num_processes)]
    command += ["--main_process_port", str(dist.main_process_port)]  # 0: accelerate picks a free port
    return [*command, "-m", "grpo_cli.commands.launch", str(run_dir)]


def launch_workers(cfg: TrainConfig, run_dir: Path) -> float:
    """Run N workers on this run directory and return the run's objective (sweep.objective)."""
    validate(cfg)  # a bad value fails here, not after N processes have started and loaded torch
    check_divisible(cfg.train.prompts_per_step, cfg.distributed.num_processes)
    write_resolved_config(cfg, run_dir, f"# trained by {cfg.distributed.num_processes} processes\n")
    env = {**os.environ, WORKER_ENV: str(run_dir)}
    if uses_cpu(cfg.train.device):
        env["ACCELERATE_USE_CPU"] = "true"
    threads = cfg.train.threads or 1
    env.setdefault("OMP_NUM_THREADS", str(threads))  # torchrun's default of 1 per worker, unless asked
    env.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(SHUTDOWN_GRACE_S))
    agent = subprocess.Popen(launch_command(cfg, run_dir), env=env)
    with forwarded_signals(agent) as received:
        code = agent.wait()
    if received or code in SIGNAL_EXITS:  # stopped on a signal: the workers saved the step they finished
        raise Interrupted(received[0] if received else SIGNAL_EXITS[code])
    if code != 0:
        raise GrpoError(f"the {cfg.distributed.num_processes} training processes failed (exit code {code}): see above")
    return objective(run_dir, cfg.sweep.objective)


@contextlib.contextmanager
def forwarded_signals(agent: subprocess.Popen) -> Iterator[list[signal.Signals]]:
    """Ctrl-C and SIGTERM that reach this process are passed on to the launcher (`agent`), and the
    wait goes on while the workers finish their step; the block yields the signals received. (A
    terminal's Ctrl-C reaches the launcher directly as well: torchrun sends the workers SIGTERM for
    the repeat, which a worker holding a signal already ignores.) A second Ctrl-C stops the wait."""
    received: list[signal.Signals] = []

    def forward(signum: int, frame: object) -> None:
        if signum == signal.SIGINT and signal.SIGINT in received:
            raise Interrupted(signum)
        received.append(signal.Signals(signum))
        agent.send_signal(signum)  # a no-op once it has exited

    if threading.current_thread() is not threading.main_thread():
        yield received  # signal handlers live in the main thread
        return
    previous = {signum: signal.signal(signum, forward) for signum in STOP_SIGNALS}
    try:
        yield received
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def objective(run_dir: Path, key: str) -> float:
    """`sweep.objective` from the run's summary.json: what the task function returns to sweepers."""
    summary = json.loads((run_dir / "summary.json").read_text())
    if key not in summary:
        figures = ", ".join(k for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool))
        raise GrpoError(f"sweep.objective={key} is not a figure of {run_dir / 'summary.json'}; it has: {figures}")
    value = summary[key]
    return float(value) if value is not None else math.nan


def join_world(cfg: TrainConfig, run_dir: Path) -> World:
    """This process's World: one process, a worker of `launch_workers`, or (under a user's own
    `accelerate launch`) the main process, which sends its config to the others."""
    if launched_processes() == 1:
        return World.single()
    world = World.join(cpu=launch_uses_cpu())
    cfg.distributed.num_processes = world.size  # the config written and saved says how it ran
    if WORKER_ENV not in os.environ and world.is_main:
        world.broadcast((cfg, run_dir))
    return world


def follow_main_process() -> None:
    """A non-main process of a user's `accelerate launch grpo train ...`: no Hydra here; train the
    config the main process composed, in its run directory."""
    from grpo_cli.commands.train import run_train

    world = World.join(cpu=launch_uses_cpu())
    cfg, run_dir = world.broadcast(None)
    run_train(cfg, run_dir)


def worker_logging(run_dir: Path, main: bool) -> None:
    """What Hydra sets up for `grpo train` (conf/hydra/job_logging/rich.yaml: the console and
    RUN/train.log, appended to the launcher's lines) in the main worker; errors only in the others."""
    if not main:
        logging.basicConfig(level=logging.ERROR)
        return
    spec = OmegaConf.load(resources.files("grpo_cli.conf") / "hydra" / "job_logging" / "rich.yaml")
    spec.handlers.file.filename = str(run_dir / "train.log")
    logging.config.dictConfig(OmegaConf.to_container(spec, resolve=True))


def _quiet_forwarding(record: logging.LogRecord) -> bool:
    """torchrun's lines for a signal it passes on and for workers that stopped on one, said better by
    `grpo train` once they have; the rest (a worker that had to be SIGKILLed, a failure) still shows."""
    message = str(record.msg)
    if message.startswith("failed (exitcode: %s)") and record.args:
        return record.args[0] not in STOPPED_WORKER
    return not message.startswith(("Received %s death signal", "Sending process %s closing signal"))


def run_agent(argv: list[str]) -> None:
    """accelerate's launcher (torchrun's agent, in this process) on `argv`. A signal it passes on
    to the workers, or one a worker got alone (all of them then stop on the same saved step), ends
    it with the shell's code for that signal (`interrupt.exit_code`) and no traceback, so that
    `grpo train` says where the run stopped."""
    from accelerate.commands.launch import launch_command as accelerate_launch
    from accelerate.commands.launch import launch_command_parser
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    for name in ("torch.distributed.elastic.agent.server.api", "torch.distributed.elastic.multiprocessing.api"):
        logging.getLogger(name).addFilter(_quiet_forwarding)
    try:
        accelerate_launch(launch_command_parser().parse_args(argv))
    except SignalException as err:
        sys.exit(exit_code(Interrupted(err.sigval)))
    except ChildFailedError as err:
        codes = {failure.exitcode for failure in err.failures.values()}
        if codes <= STOPPED_WORKER and codes & set(SIGNAL_EXITS):  # stopped on a signal, having saved what it could
            sys.exit(max(codes))
        raise


def main() -> None:
    """A worker of `launch_workers`: train the run directory's resolved config (`--agent`: the launcher)."""
    if sys.argv[1] == AGENT:  # before the trainer's imports: the launcher needs none of them
        run_agent(sys.argv[2:])
        return
    from grpo_cli.commands.errors import report_user_errors
    from grpo_cli.commands.train import run_train

    run_dir = Path(sys.argv[1])
    worker_logging(run_dir, int(os.environ.get("RANK", "0")) == 0)
    report_user_errors(lambda: run_train(read_resolved_config(run_dir), run_dir))


if __name__ == "__main__":
    main()
