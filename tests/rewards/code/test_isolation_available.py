"""CI must not go green without testing an isolated sandbox backend (bwrap or unshare).

`.ci/run` installs bubblewrap and sets GRPO_REQUIRE_ISOLATED_SANDBOX=1; with it, a machine where no
isolated backend works fails here, and every bwrap test fails instead of skipping (conftest.py).
Without it (a laptop, a container without namespaces) the same tests skip and say why.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from grpo_cli.rewards.code import HarnessFault
from tests.conftest import REPO, Background
from tests.rewards.code.conftest import ISOLATED, REQUIRE_ISOLATED_ENV, isolation_missing


def test_an_isolated_backend_works_here(sandbox_factory):
    failures = []
    for backend in ISOLATED:
        box = sandbox_factory.build(backend, prewarm=True)  # the same Sandbox the `sandbox` tests use
        if not isinstance(box, HarnessFault):
            assert box.backend == backend
            return
        failures.append(f"{backend}: {box}")
    isolation_missing(f"no isolated sandbox backend works here ({'; '.join(failures)})")


# A pytest run in which neither bwrap nor unshare is installed, whatever this machine has.
WITHOUT_NAMESPACE_TOOLS = """
import sys
import pytest
from grpo_cli.rewards.code import backends
backends.find_tool = lambda name: None if name in backends.NAMESPACED else "builtin"
sys.exit(pytest.main(sys.argv[1:]))
"""
NEEDS_ISOLATION = [
    "tests/rewards/code/test_isolation_available.py::test_an_isolated_backend_works_here",
    "tests/rewards/code/test_sandbox.py::test_honest_function_and_kwargs[bwrap]",
    "tests/rewards/code/test_sandbox.py::test_require_isolation_is_met_by_a_namespace_backend",
]


def _pytest_without_namespace_tools(required: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != REQUIRE_ISOLATED_ENV}
    if required:
        env[REQUIRE_ISOLATED_ENV] = "1"
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_NAMESPACE_TOOLS, "-q", "-rfEs", "-p", "no:cacheprovider", *NEEDS_ISOLATION],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def inner_runs(request: pytest.FixtureRequest) -> Iterator[Background]:
    """Both inner pytest runs at once: each pays seconds of start-up."""
    cases = {
        f"missing_bwrap_fails_only_where_isolation_is_required:{required}": (
            lambda required=required: _pytest_without_namespace_tools(required)
        )
        for required in (True, False)
    }
    background = Background(request, cases)
    yield background
    background.close()


@pytest.mark.parametrize("required", [True, False], ids=["ci", "elsewhere"])
def test_missing_bwrap_fails_only_where_isolation_is_required(required: bool, inner_runs: Background) -> None:
    result = inner_runs.result(f"missing_bwrap_fails_only_where_isolation_is_required:{required}")
    output = result.stdout + result.stderr
    summary = [line for line in output.splitlines() if line.startswith(("FAILED ", "ERROR ", "SKIPPED "))]
    if required:  # a failure in the test or in its fixture's setup (an error): never a skip
        assert result.returncode == 1, output
        for test in NEEDS_ISOLATION:
            assert any(test in line and not line.startswith("SKIPPED") for line in summary), output
        assert "`bwrap` is not installed" in output and f"{REQUIRE_ISOLATED_ENV}=1" in output, output
    else:
        assert result.returncode == 0, output
        assert "3 skipped" in output, output
        assert "`bwrap` is not installed" in output, output  # the skip says why
