"""Data-parallel training (issue 14): N processes compute the update one process computes on the
same global batch, and a killed multi-process run resumes.

Real processes throughout: accelerate's launcher (torchrun, gloo on the CPU) and the real
`grpo train distributed.num_processes=2` command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo_cli.config.schema import OptimConfig
from tests.conftest import REPO, kill_once_saved, read_metrics, reproducible, run_grpo

STEP_SCRIPT = Path(__file__).with_name("data_parallel_step.py")
QUICK = ("monitor.console=plain", "monitor.plots=false", "train.prompts_per_step=4", "rollout.num_generations=4")


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def _run_together(*commands: list[str]) -> None:
    """The commands side by side (most of each is start-up), each to success."""
    started = [subprocess.Popen(c, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for c in commands]
    for proc in started:
        output = proc.communicate(timeout=300)[0].decode()
        assert proc.returncode == 0, output[-3000:]


def _accelerate_launch(*target: str) -> list[str]:
    """`accelerate launch` of 2 CPU processes on `target` (a script, or `-m grpo_cli ...`), as a user types it."""
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_machines", "1"]
    launch += ["--mixed_precision", "no", "--dynamo_backend", "no", "--num_processes", "2"]
    return [*launch, "--main_process_port", "0", *target]


@pytest.fixture(scope="module")
def one_and_two(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """The step script on 1 process, on 2 under ddp and on 2 under fsdp, side by side."""
    root = tmp_path_factory.mktemp("data_parallel")
    args = [str(STEP_SCRIPT), str(tiny_model_dir)]
    _run_together(
        [sys.executable, *args, str(root / "one"), str(root / "one.pt")],
        _accelerate_launch(*args, str(root / "ddp"), str(root / "ddp.pt"), "ddp"),
        _accelerate_launch(*args, str(root / "fsdp"), str(root / "fsdp.pt"), "fsdp"),
    )
    return {name: torch.load(root / f"{name}.pt") for name in ("one", "ddp", "fsdp")}


# Adam divides each gradient element by its own running RMS, so an element near zero whose gradients
# agree within the tolerance above (another CPU sums in another order) can move its weight a few
# percent of the learning rate apart: 1.5e-5 of the step script's lr 2e-3 was seen on a CPU without
# AVX-512. A wrong update (a step missed, a shard's weights left unchanged) is off by about the
# learning rate on most elements; a tenth of it tells the two apart (a wrong gradient scale, which
# Adam would hide, is the gradient check's to catch).
ADAM_WEIGHT_ATOL = 0.1 * OptimConfig().lr
WAITS = ("async/learner_idle", "async/sampler_idle", "async/overlap")  # rollout.max_staleness: shares of wall time


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
@pytest.mark.parametrize("case", ["batch_scaled", "dapo", "bnpo", "entropy_terms", "luspo_adaptive_entropy"])
def test_two_processes_compute_the_single_process_update(
    one_and_two: dict[str, dict], case: str, strategy: str
) -> None:
    """scale_rewards=batch needs the batch's std, dapo/bnpo the batch's token count (the two
    processes' shares differ: 15 tokens against 48), dapo also across accumulated micro-batches;
    top_entropy_quantile's threshold and the entropy bonus's mean, the step's tokens over both;
    luspo's sequence count and adaptive entropy's measured mean (its coefficient and last entropy).
    fsdp: the same update from sharded weights, gradients and optimizer state, gathered back."""
    one, two = one_and_two["one"][case], one_and_two[strategy][case]
    assert (one["processes"], two["processes"]) == (1, 2)
    lengths = one["lengths"]
    assert sum(lengths[:8]) != sum(lengths[8:])  # uneven shares: local denominators would be wrong
    for step, (a, b) in enumerate(zip(one["steps"], two["steps"])):
        assert a["fused"] == b["fused"], f"step {step}: fused rewards differ"
        for key, value in a["metrics"].items():
            assert b["metrics"][key] == pytest.approx(value, rel=1e-5, abs=1e-7), f"step {step}: {key}"
        assert b["entropy_state"] == pytest.approx(a["entropy_state"], rel=1e-5), f"step {step}: adaptive entropy"
        for index, (ga, gb) in enumerate(zip(a["grads"], b["grads"])):
            torch.testing.assert_close(gb, ga, rtol=1e-5, atol=1e-6, msg=f"step {step}: gradient {index}")
        for wa, wb in zip(a["weights"], b["weights"]):
            torch.testing.assert_close(wb, wa, rtol=0, atol=ADAM_WEIGHT_ATOL)
    assert two["steps"][1]["metrics"]["kl"] > 0  # the second step's maths is not the trivial first one


def test_a_killed_two_process_run_resumes(tmp_path: Path) -> None:
    """`grpo train distributed.num_processes=2` checkpoints every 2 steps and is killed after the
    second checkpoint. A user's `accelerate launch $(which grpo) train ...` (the main process
    composes, the other trains its config) continues it in the same directory, each step logged
    once; then one more step on a single process (another count: handled, and the log says so)."""
    run_dir = tmp_path / "run"
    args = ["train", "train.steps=8", "train.save_every=2", *QUICK, f"hydra.run.dir={run_dir}"]
    kill_once_saved(  # the whole launch: launcher, torchrun and both workers
        [sys.executable, "-m", "grpo_cli", *args, "distributed.num_processes=2"],
        run_dir / "checkpoints" / "step_000004",
        _env(),
    )
    assert not (run_dir / "summary.json").exists()

    resumed = subprocess.run(
        _accelerate_launch("-m", "grpo_cli", *args),
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resuming from" in (run_dir / "train.log").read_text()
    assert [row["step"] for row in read_metrics(run_dir)] == list(range(1, 9))
    assert json.loads((run_dir / "summary.json").read_text())["processes"] == 2
    assert "num_processes: 2" in (run_dir / "config.yaml").read_text()
    assert not (tmp_path / "outputs").exists()  # no second run directory from another process's Hydra

    single = run_grpo(*[a for a in args if a != "train.steps=8"], "train.steps=9")
    assert single.returncode == 0, single.stdout[-3000:] + single.stderr[-3000:]
    assert "written by 2 process(es), this run has 1" in (run_dir / "train.log").read_text()
    assert [row["step"] for row in read_metrics(run_dir)] == list(range(1, 10))


def test_a_multi_turn_run_trains_on_two_processes(tmp_path: Path) -> None:
    """Each process runs its share of the trajectories (an environment object per row): the turns,
    the environment's reward and the conversations come back from both, every step. Pipelined
    (rollout.max_staleness=1, issue 54), under ddp and fsdp side by side: every process's sampler
    thread samples batch j with the policy of step j-1 (a fixed lag, or the processes' collectives
    would not meet), and fsdp's sampler, refreshed from the gathered weights, draws what ddp's draws.
    Under env.token_mode=per_turn (issue 55) a two-turn episode trains two rows, so the processes'
    groups differ in rows and are filled to one width: else their micro-batches would not meet."""
    runs = {strategy: tmp_path / strategy for strategy in ("ddp", "fsdp")}
    args = [
        "train", "train.steps=3", *QUICK, "distributed.num_processes=2", "rollout.max_staleness=1",
        "optim.warmup_steps=0", "env=custom", "env.target=tests.rollout.environments:EchoEnv", "env.max_turns=2",
        "rollout.max_new_tokens=8", "reward.functions=[{name: env_reward, target: env_reward, weight: 1.0}]",
        "env.token_mode=per_turn",
    ]  # fmt: skip
    grpo = [sys.executable, "-m", "grpo_cli", *args]
    _run_together(*[[*grpo, f"hydra.run.dir={d}", f"distributed.strategy={s}"] for s, d in runs.items()])
    for run_dir in runs.values():
        assert json.loads((run_dir / "summary.json").read_text())["processes"] == 2
        rows = read_metrics(run_dir)
        assert [row["async/staleness"] for row in rows] == [0.0, 1.0, 1.0]  # batch 1 by the starting weights
        assert rows[2]["rollout/engine_gap"] > 1e-4  # step 3's batch: sampled after 1 update, trained after 2
        for row in rows:
            assert 1.0 <= row["env/turns_mean"] <= 2.0 and row["env/error_frac"] == 0.0
            assert row["reward/env_reward/mean"] == row["env/turns_mean"]  # EchoEnv's reward: the turns it saw
        for line in (run_dir / "completions" / "step_000001.jsonl").read_text().splitlines():
            roles = [m["role"] for m in json.loads(line)["messages"]]
            assert roles[::2] == ["assistant"] * len(roles[::2]) and set(roles[1::2]) <= {"user"}
    ddp, fsdp = (reproducible(read_metrics(d)) for d in runs.values())
    for a, b in zip(ddp, fsdp):
        for key, value in a.items():
            if isinstance(value, float) and not key.startswith(WAITS):
                assert b[key] == pytest.approx(value, rel=1e-5, abs=1e-6), f"step {a['step']}: {key}"


def test_a_batch_that_does_not_split_fails_before_any_worker_starts(tmp_path: Path) -> None:
    from grpo_cli.commands.launch import launch_workers
    from grpo_cli.config.schema import TrainConfig
    from grpo_cli.errors import GrpoError

    cfg = TrainConfig()
    cfg.distributed.num_processes = 3  # 16 prompts per step
    with pytest.raises(GrpoError, match=r"train.prompts_per_step=16 does not split over 3 processes.*e\.g\. 18"):
        launch_workers(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()  # nothing written, nothing launched
