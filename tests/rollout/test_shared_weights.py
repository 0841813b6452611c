"""The trainer's half of the vLLM weight push, without vLLM: what `SharedWeights` writes is what
a worker maps (`vllm_worker.tensor_views`, the function the worker calls), byte for byte, across
pushes that grow the file; and each training process's engine gets its own cores."""

from __future__ import annotations

import os

import pytest
import torch

from grpo_cli.rollout.shared_weights import ALIGN, SharedWeights
from grpo_cli.rollout.vllm import local_rank_cores
from grpo_cli.rollout.vllm_worker import tensor_views
from grpo_cli.rollout.weight_sync import engine_weights
from grpo_cli.training.alerts import engine_gap_alert
from grpo_cli.training.async_pipeline import split_cores


def mapped(shared: SharedWeights, layout) -> dict[str, torch.Tensor]:
    """The worker's view: a mapping of its own, opened by path and size."""
    storage = torch.UntypedStorage.from_file(str(shared.path), shared=True, nbytes=shared.nbytes)
    return {name: tensor.clone() for name, tensor in tensor_views(storage, layout)}


def test_a_worker_reads_every_pushed_tensor_exactly_across_pushes(tiny_model_dir) -> None:
    from transformers import AutoModelForCausalLM

    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    shared = SharedWeights()
    try:
        extra = [("a.bf16", torch.randn(3, 7).bfloat16()), ("b.int", torch.arange(5))]  # odd sizes, other dtypes
        pushed = [*engine_weights(policy), *extra]
        layout = shared.write(pushed)
        assert all(offset % ALIGN == 0 for *_, offset in layout)
        assert shared.path.stat().st_size == shared.nbytes
        first = mapped(shared, layout)
        for name, tensor in pushed:
            assert first[name].dtype == tensor.dtype and torch.equal(first[name], tensor), name

        with torch.no_grad():
            policy.model.layers[0].mlp.down_proj.weight.zero_()
        grown = [*engine_weights(policy), *extra, ("c.late", torch.randn(64, 64))]  # a bigger push
        layout = shared.write(grown)
        second = mapped(shared, layout)
        for name, tensor in grown:
            assert torch.equal(second[name], tensor), name
        assert not second["model.layers.0.mlp.down_proj.weight"].any()
    finally:
        shared.close()
    assert not shared.path.exists()


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux's core affinity")
def test_each_local_process_binds_its_own_share_of_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    cores = sorted(os.sched_getaffinity(0))
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert local_rank_cores() == ",".join(map(str, cores))  # one process: every core, none kept back
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    shares = []
    for rank in (0, 1):
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        shares.append(local_rank_cores().split(","))
    assert shares[0] and shares[1]
    if len(cores) >= 2:
        assert not set(shares[0]) & set(shares[1])  # disjoint
        assert sorted(map(int, shares[0] + shares[1])) == cores


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux's core affinity")
def test_a_pipelined_engine_binds_the_cores_the_learner_leaves_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """rollout.max_staleness: the engine samples while the trainer trains, on the half of the cores
    the learner's thread is not pinned to (training.async_pipeline.split_cores)."""
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    split = split_cores(torch.device("cpu"), 0)
    engine = set(map(int, local_rank_cores(pipelined=True).split(",")))
    if split is None:  # one core: nothing to halve
        assert engine == set(os.sched_getaffinity(0))
    else:
        assert engine == split.sampler and not engine & split.learner


def test_the_engine_gap_alert_names_the_gap_the_threshold_and_the_cause() -> None:
    assert engine_gap_alert(None, 0.01) is None  # the hf backend: no engine, no figure
    assert engine_gap_alert(2e-7, 0.01) is None
    assert engine_gap_alert(0.5, 0.0) is None  # 0: off
    message = engine_gap_alert(0.31, 0.01)
    assert "rollout/engine_gap=0.31 > monitor.engine_gap_alert=0.01" in message and "push" in message
