"""One Sandbox per backend and mode for the whole run, skipped where that backend's probe fails here.

Every `sandbox` test runs on each backend twice: with pre-warmed runners (the default; each
completion is a worker forked from a runner that stays) and one-shot (`prewarm=False`: the backend
is started per completion). "Nothing left behind" means: no process of the sandbox but its idle
runners, and no file in any work dir.
"""

from __future__ import annotations

import os

import pytest

from grpo_cli.rewards.code import HarnessFault, Sandbox, SandboxConfig

BACKENDS = ("bwrap", "unshare", "process")
MODES = [(backend, prewarm) for backend in BACKENDS for prewarm in (True, False)]
ISOLATED = ("bwrap", "unshare")
AS_ROOT = os.geteuid() == 0
TIMEOUT_S = 2.0


def processes_running(needle: bytes) -> list[int]:
    """Live processes whose command line (arguments joined by NUL bytes) contains `needle`."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if needle in f.read():
                        found.append(int(name))
            except OSError:
                continue
    return found


def sandbox_processes(tag: str) -> list[int]:
    """Live processes whose command line carries the sandbox's tag (every runner and every fork of it)."""
    return processes_running(tag.encode())


def leftovers(box: Sandbox) -> list[int]:
    """Processes of the sandbox that are not its pre-warmed runners: what sessions left behind."""
    return sorted(set(sandbox_processes(box.tag)) - box.server_pids())


def assert_clean(box: Sandbox) -> None:
    assert leftovers(box) == []
    assert os.listdir(box.work_root) == []
    for server_dir in os.listdir(box.server_root):  # each runner's dir, emptied after every session
        assert os.listdir(os.path.join(box.server_root, server_dir)) == []


def mode_id(mode: tuple[str, bool]) -> str:
    backend, prewarm = mode
    return backend if prewarm else f"{backend}-oneshot"


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

    get.boxes = lambda: [box for box in made.values() if isinstance(box, Sandbox)]
    yield get
    for box in made.values():
        if isinstance(box, Sandbox):
            box.close()


@pytest.fixture(params=MODES, ids=mode_id)
def sandbox(request, sandbox_factory) -> Sandbox:
    backend, prewarm = request.param
    return sandbox_factory(backend, prewarm=prewarm)
