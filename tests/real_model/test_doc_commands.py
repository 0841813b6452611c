"""The pages' commands on the packaged SmolLM2 (`model=smollm2_135m`: real-models.md's before/after
evals, commands.md's math rollout, speed-memory.md's plans), which tests/docs/test_pages_run.py
leaves here to share this session's one conversion of the GGUF file. Each runs shrunk to 1 prompt
and 4 new tokens, after the commands whose output it reads, as tests/docs/plan.py plans them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.plan import Step, plan
from tests.docs.test_pages_run import PAGES, run_steps


def with_neighbours(steps: list[Step], chosen: set[str]) -> list[Step]:
    """The chosen steps, the ones reading their output, and every step those need: a chain whole."""
    by_id = {s.id: s for s in steps}
    chosen = set(chosen)
    for step in steps:  # page order: a reader of a chosen step's output joins it
        if set(step.needs) & chosen:
            chosen.add(step.id)
    todo = list(chosen)
    while todo:
        for need in by_id[todo.pop()].needs:
            if need not in chosen:
                chosen.add(need)
                todo.append(need)
    return [s for s in steps if s.id in chosen]


@pytest.fixture(scope="module")
def real_model_run(smollm2_dir: Path, smollm2_cache: Path, tmp_path_factory: pytest.TempPathFactory):
    steps = plan(PAGES, model_cache=smollm2_cache)  # smollm2_dir: converted before any command starts
    real = {s.id for s in steps if s.real_model and s.why_not is None}  # a repeat runs once
    assert len(real) >= 4, "the pages show a handful of real-model commands: the plan's detection broke"
    chain = [s for s in with_neighbours(steps, real) if s.why_not is None]
    # one at a time: two 135M-parameter models sampling at once on 2 cores take 10x as long, not 2x
    return chain, real, run_steps(chain, tmp_path_factory.mktemp("reader"), workers=1)


def test_every_real_model_command_of_the_pages_runs(real_model_run) -> None:
    chain, real, results = real_model_run
    assert real <= {s.id for s in chain}, "a real-model command was planned out"
    failed = [f"{s.id}\n{results[s.id].get('why') or results[s.id]['log']}" for s in chain if results[s.id]["rc"] != 0]
    assert not failed, "\n\n".join(failed)
