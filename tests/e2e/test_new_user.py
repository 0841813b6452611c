"""What a new user met on a fresh clone (issue 33), replayed as they typed it: each mistake is one
line on stderr, and nothing is written outside the run directory.

`grpo train model.path=HuggingFaceTB/SmolLM2-135M-Instruct` (no `model=hf`) trained the random tiny
model for 300 steps and wrote it to ./HuggingFaceTB/SmolLM2-135M-Instruct/, where the next
`grpo train model=hf model.path=<the same>` found it and trained it as SmolLM2.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Background, run_grpo

HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
TINY_RUN = ["train.steps=1", "train.prompts_per_step=2", "rollout.num_generations=2"]  # were it to run at all


@pytest.fixture(scope="module")
def chain(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Background, Path]]:
    """Each command in a fresh working directory of its own, the hub offline (as every test has it)
    with an empty cache of its own."""
    root = tmp_path_factory.mktemp("new_user")
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(root / "hub_cache")}

    def grpo(name: str, *args: str) -> subprocess.CompletedProcess:
        (root / name).mkdir()
        return run_grpo(*args, "hydra.run.dir=run", cwd=root / name, env=env, timeout=300)

    cases = {
        "a_hub_id_without_model_hf_is_one_line_and_writes_no_model:first": lambda: grpo(
            "first", "train", f"model.path={HUB_ID}", *TINY_RUN
        ),
        "a_hub_id_without_model_hf_is_one_line_and_writes_no_model:second": lambda: grpo(
            "second", "train", "model=hf", f"model.path={HUB_ID}", *TINY_RUN
        ),
        "a_group_typo_is_one_line": lambda: grpo("group_typo", "train", "curriculum=three_phse"),
        "a_sweep_with_cfg_job_is_one_line": lambda: grpo(
            "sweep_cfg", "train", "-m", "optim.lr=1e-3,2e-3", "--cfg", "job"
        ),
        "evals_seed_names_trains_seed": lambda: grpo("seed", "train", "seed=abc"),
    }
    background = Background(request, cases)
    yield background, root
    background.close()


def one_line(result: subprocess.CompletedProcess) -> str:
    """The error line, after checking it is the only thing printed."""
    assert result.returncode == 1, result.stderr[-3000:]
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stdout + result.stderr
    return lines[0].removeprefix("error: ")


def written(directory: Path) -> list[str]:
    return sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file())


def test_a_hub_id_without_model_hf_is_one_line_and_writes_no_model(chain: tuple[Background, Path]) -> None:
    background, root = chain
    first = one_line(background.result("a_hub_id_without_model_hf_is_one_line_and_writes_no_model:first"))
    assert first == (
        f"invalid value model.path='{HUB_ID}': read by model=hf only, and this run's model=tiny (a random-init "
        "model built in the run directory) ignores it: add model=hf, or drop model.path"
    )
    # Only Hydra's record of the run and its log, inside the run directory: no model anywhere.
    assert written(root / "first") == [
        "run/.hydra/config.yaml",
        "run/.hydra/hydra.yaml",
        "run/.hydra/overrides.yaml",
        "run/run.lock",
        "run/train.log",
    ]
    second = one_line(background.result("a_hub_id_without_model_hf_is_one_line_and_writes_no_model:second"))
    assert second.startswith(
        f"model.path={HUB_ID}: not found here (no such directory, nor a .gguf file), and the hub is unreachable "
        "(HF_HUB_OFFLINE=1) with no copy in its cache"
    )
    assert [p.split("/")[0] for p in written(root / "second")] == ["run"] * 5
    assert not (root / "hub_cache").exists()


def test_a_group_typo_is_one_line(chain: tuple[Background, Path]) -> None:
    background, root = chain
    assert one_line(background.result("a_group_typo_is_one_line")) == (
        "invalid value curriculum='three_phse': must be one of constant, partial_to_exact, phased, three_phase, "
        "three_phase_efficiency; did you mean three_phase?"
    )
    assert written(root / "group_typo") == []  # refused before Hydra composes


def test_a_sweep_with_cfg_job_is_one_line(chain: tuple[Background, Path]) -> None:
    background, _ = chain
    assert one_line(background.result("a_sweep_with_cfg_job_is_one_line")).startswith("-m with --cfg job: ")


def test_evals_seed_names_trains_seed(chain: tuple[Background, Path]) -> None:
    background, _ = chain
    assert one_line(background.result("evals_seed_names_trains_seed")) == (
        "unknown config key seed; did you mean train.seed or data.seed?"
    )
