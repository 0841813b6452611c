"""One Sandbox per backend and mode for the whole run, skipped where that backend's probe fails here.

Except in CI: `.ci/run` installs bubblewrap and sets GRPO_REQUIRE_ISOLATED_SANDBOX=1, and then a
test that cannot run on bwrap fails instead of skipping, so a green run has exercised an isolated
backend (unshare may still skip: CI containers often disable the user namespaces it needs).

Every `sandbox` test runs on each backend twice: with pre-warmed runners (the default; each
completion is a worker forked from a runner that stays) and one-shot (`prewarm=False`: the backend
is started per completion). "Nothing left behind" means: no process of the sandbox but its idle
runners, and no file in any work dir.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

from grpo_cli.rewards.code import HarnessFault, Sandbox, SandboxConfig

BACKENDS = ("bwrap", "unshare", "process")
MODES = [(backend, prewarm) for backend in BACKENDS for prewarm in (True, False)]
ISOLATED = ("bwrap", "unshare")
AS_ROOT = os.geteuid() == 0
TIMEOUT_S = 2.0
REQUIRE_ISOLATED_ENV = "GRPO_REQUIRE_ISOLATED_SANDBOX"
REQUIRE_ISOLATED = os.environ.get(REQUIRE_ISOLATED_ENV, "") not in ("", "0")
REQUIRED_BACKENDS = ("bwrap",) if REQUIRE_ISOLATED else ()  # what .ci/run installs


def isolation_missing(message: str) -> NoReturn:
    """Skip, or under GRPO_REQUIRE_ISOLATED_SANDBOX=1 fail: a test that needs an isolated backend."""
    if REQUIRE_ISOLATED:
        pytest.fail(f"{message} ({REQUIRE_ISOLATED_ENV}=1: this run must test an isolated sandbox)", pytrace=False)
    pytest.skip(message)


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

    def build(backend: str, **overrides) -> Sandbox | HarnessFault:
        """The shared Sandbox for these settings, or why it cannot start here (never skips)."""
        key = (backend, tuple(sorted(overrides.items())))
        if key not in made:
            cfg = SandboxConfig(backend=backend, timeout_s=overrides.pop("timeout_s", TIMEOUT_S), **overrides)
            try:
                made[key] = Sandbox(cfg)
            except HarnessFault as err:
                made[key] = err
        return made[key]

    def get(backend: str, **overrides) -> Sandbox:
        box = build(backend, **overrides)
        if isinstance(box, HarnessFault):
            message = f"the {backend} sandbox does not work on this machine: {box}"
            if backend in REQUIRED_BACKENDS:
                isolation_missing(message)
            pytest.skip(message)
        return box

    get.build = build
    get.boxes = lambda: [box for box in made.values() if isinstance(box, Sandbox)]
    yield get
    for box in made.values():
        if isinstance(box, Sandbox):
            box.close()


@pytest.fixture(params=MODES, ids=mode_id)
def sandbox(request, sandbox_factory) -> Sandbox:
    backend, prewarm = request.param
    return sandbox_factory(backend, prewarm=prewarm)
