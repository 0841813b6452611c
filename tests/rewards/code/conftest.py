"""One Sandbox per backend for the whole run, skipped where that backend's probe fails here."""

from __future__ import annotations

import os

import pytest

from grpo_cli.rewards.code import HarnessFault, Sandbox, SandboxConfig

BACKENDS = ("bwrap", "unshare", "process")
ISOLATED = ("bwrap", "unshare")
AS_ROOT = os.geteuid() == 0
TIMEOUT_S = 2.0


def sandbox_processes(tag: str) -> list[int]:
    """Live processes whose command line carries the sandbox's tag (every runner and every fork of it)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if tag.encode() in f.read():
                        found.append(int(name))
            except OSError:
                continue
    return found


def processes_of_uid(uid: int) -> set[int]:
    found = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/status") as f:
                    for line in f:
                        if line.startswith("Uid:") and int(line.split()[1]) == uid:
                            found.add(int(name))
            except OSError:
                continue
    return found


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture(scope="session")
def sandbox_factory():
    made: dict[tuple, Sandbox | HarnessFault] = {}

    def get(backend: str, **overrides) -> Sandbox:
        key = (backend, tuple(sorted(overrides.items())))
        if key not in made:
            cfg = SandboxConfig(backend=backend, timeout_s=overrides.pop("timeout_s", TIMEOUT_S), **overrides)
            try:
                made[key] = Sandbox(cfg)
            except HarnessFault as err:
                made[key] = err
        box = made[key]
        if isinstance(box, HarnessFault):
            pytest.skip(f"the {backend} sandbox does not work on this machine: {box}")
        return box

    yield get
    for box in made.values():
        if isinstance(box, Sandbox):
            box.close()


@pytest.fixture(params=BACKENDS)
def sandbox(request, sandbox_factory) -> Sandbox:
    return sandbox_factory(request.param)
