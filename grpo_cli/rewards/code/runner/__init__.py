"""The program that runs inside the sandbox, one process tree per completion (stdlib only, Python >= 3.8).

The sandbox copies this directory whole, as a package named `runner`, and starts `__main__.py` by
its path: `python -I -S -B runner/__main__.py PROTO_FD` for one session, or pre-warmed as
`runner/__main__.py --serve CTRL_FD`. Its modules import one another relatively, so the same files
work inside grpo_cli and copied, where grpo_cli is not importable; nothing here imports grpo_cli.

- The **supervisor** (`supervisor.py`; root when the trainer is root) reads the job header from
  stdin, forks the worker and then only waits. When the worker ends it makes sure nothing the
  candidate started survives: as PID 1 of a PID namespace it simply exits (the kernel kills the
  rest); otherwise it is a child subreaper, so orphans and `setsid` daemons come back to it to be
  killed. On SIGTERM (the trainer's deadline, `process` backend) it does the same at once.
- The **worker** (`worker.py`) applies the rlimits, drops to the unprivileged user, moves the
  protocol pipes to high close-on-exec descriptors, points fd 0 at /dev/null, and only then
  compiles the candidate.
- The **server** (`prewarmed.py`, `--serve`) is a supervisor that stays: the interpreter, the
  namespaces and the common imports are paid for once, and each completion is a fresh worker forked
  from it, with the pipes the trainer passes over the control socket. After each worker it kills
  and reaps everything left in the sandbox before it says the session is over, and retires itself
  when something could outlive a session (SysV IPC objects) so that no completion ever sees
  another's leftovers.

What travels between the trainer and these processes, and why the candidate cannot forge it, is
in `wire.py`; the process plumbing they share (prctl, descriptors, reaping) in `processes.py`.
"""
