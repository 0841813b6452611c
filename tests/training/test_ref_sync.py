"""`algo.ref_sync` (issue 24, TR-DPO): every N optimizer steps the KL reference becomes
alpha·policy + (1 − alpha)·reference; checkpointed and resumed bit-exactly after a Ctrl-C in the
middle of a sync interval; refused where there is no reference of its own to move."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from grpo_cli.config.schema import TrainConfig
from grpo_cli.core.update import sync_reference
from grpo_cli.errors import GrpoError
from grpo_cli.monitor import MetricsFile, StepResult
from grpo_cli.training import GRPOTrainer
from tests.conftest import read_metrics, reproducible
from tests.training.test_trainer import InterruptAt


def config(steps: int, every: int = 3, alpha: float = 0.5) -> TrainConfig:
    cfg = TrainConfig()
    cfg.train.steps, cfg.train.prompts_per_step, cfg.rollout.num_generations = steps, 4, 4
    cfg.data.num_examples = 100
    cfg.algo.beta = 0.04
    cfg.algo.ref_sync.every, cfg.algo.ref_sync.alpha = every, alpha
    return cfg


class Snapshots:
    """The policy's and the reference's weights after each step (an observer: runs once the step is final)."""

    def __init__(self) -> None:
        self.trainer: GRPOTrainer | None = None
        self.policy: list[list[torch.Tensor]] = []
        self.reference: list[list[torch.Tensor]] = []

    def on_step(self, result: StepResult) -> None:
        self.policy.append([p.detach().clone() for p in self.trainer.model.parameters()])
        self.reference.append([p.detach().clone() for p in self.trainer.learner.reference.parameters()])


def run(cfg: TrainConfig, run_dir: Path, *observers) -> GRPOTrainer:
    metrics = MetricsFile(run_dir / "metrics.jsonl")
    trainer = GRPOTrainer(cfg, run_dir, [*observers, metrics])
    trainer.setup()
    for observer in observers:
        if isinstance(observer, Snapshots):
            observer.trainer = trainer
    try:
        trainer.train()
    finally:
        metrics.close()
        trainer.cleanup()  # the reward workers end with the run, not with the test session
    return trainer


def test_sync_reference_mixes_the_policy_in_with_alpha() -> None:
    policy, reference = torch.nn.Linear(2, 1, bias=False), torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        policy.weight.fill_(1.0)
        reference.weight.zero_()
    sync_reference(reference, policy, 0.6)
    assert reference.weight[0].tolist() == pytest.approx([0.6, 0.6])
    with torch.no_grad():
        policy.weight.fill_(2.0)
    sync_reference(reference, policy, 0.6)
    assert reference.weight[0].tolist() == pytest.approx([0.6 * 2 + 0.4 * 0.6] * 2)


def test_the_reference_moves_every_n_optimizer_steps_and_only_then(tmp_path: Path) -> None:
    """One optimizer step per training step, every = 3, alpha = 0.5: after step 3 the reference is
    the average of the step-3 policy and the starting model; between syncs it does not move."""
    snapshots = Snapshots()
    trainer = GRPOTrainer(config(steps=4), tmp_path, [snapshots])
    trainer.setup()
    snapshots.trainer = trainer
    start = [p.detach().clone() for p in trainer.learner.reference.parameters()]
    try:
        trainer.train()
    finally:
        trainer.cleanup()
    for step in (0, 1):  # steps 1 and 2: the starting model
        assert all(torch.equal(a, b) for a, b in zip(snapshots.reference[step], start, strict=True))
    expected = [0.5 * policy + 0.5 * ref for policy, ref in zip(snapshots.policy[2], start, strict=True)]
    assert all(torch.allclose(a, b, rtol=0, atol=1e-7) for a, b in zip(snapshots.reference[2], expected, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(snapshots.reference[3], snapshots.reference[2], strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(snapshots.reference[2], start, strict=True))


def test_a_ctrl_c_between_syncs_resumes_to_the_uninterrupted_run_bit_for_bit(tmp_path: Path) -> None:
    """Synced at step 3, interrupted (and saved) at step 4, resumed through the sync at step 6: the
    reference comes back from the checkpoint, not from the starting model."""
    straight = Snapshots()
    run(config(steps=7), tmp_path / "straight", straight)
    with pytest.raises(KeyboardInterrupt):
        run(config(steps=7), tmp_path / "resumed", InterruptAt(4))
    assert sorted(p.name for p in (tmp_path / "resumed" / "checkpoints").iterdir()) == ["step_000004"]
    resumed = Snapshots()
    run(config(steps=7), tmp_path / "resumed", resumed)  # train.resume=auto
    assert reproducible(read_metrics(tmp_path / "resumed")) == reproducible(read_metrics(tmp_path / "straight"))
    for got, want in ((resumed.policy[-1], straight.policy[-1]), (resumed.reference[-1], straight.reference[-1])):
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert len(resumed.reference) == 3  # steps 5, 6 and 7 ran after the resume


def test_ref_sync_is_refused_without_a_reference_of_its_own(tmp_path: Path) -> None:
    no_kl = config(steps=1)
    no_kl.algo.beta = 0.0
    with pytest.raises(GrpoError, match="algo.beta=0 has none"):
        GRPOTrainer(no_kl, tmp_path).setup()
    lora = copy.deepcopy(config(steps=1))
    lora.model.lora.enabled = True
    with pytest.raises(GrpoError, match="the reference is the frozen base"):
        GRPOTrainer(lora, tmp_path).setup()


def test_fsdp_with_ref_sync_is_refused_for_what_its_checkpoint_would_lose(tmp_path: Path) -> None:
    """Sharded, the reference lives in shards (`training.sharding`), and a checkpoint's `reference`
    (`checkpointing.training_state`) is the main process's state_dict: its shards alone. A resume
    would then KL against a reference missing the other processes' halves, so the start-up check
    refuses the pair and says why; lifting it means gathering the reference as the optimizer is."""
    sharded = config(steps=1)
    sharded.distributed.strategy, sharded.distributed.num_processes = "fsdp", 2
    with pytest.raises(GrpoError, match=r"algo\.ref_sync\.every=3.*checkpoint would keep.*shards of the reference"):
        GRPOTrainer(sharded, tmp_path).setup()
