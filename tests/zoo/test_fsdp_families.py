"""FSDP2 on the zoo (issue 53 item 4, `distributed.strategy=fsdp`): `fully_shard` wraps each family's
decoder blocks one by one (training.sharding.decoder_layers, from transformers' `_no_split_modules`),
a hybrid's linear-attention and Mamba blocks and a mixture-of-experts block included, leaving only the
embeddings, the final norm and the head to the root; and two processes train what one process trains
on a hybrid (Qwen3.5) and a mixture-of-experts model (Qwen3-MoE).

The two-process half runs this file as a script under `accelerate launch` and, meanwhile, its `main` in
the test's process for the one-process run (tests/training/data_parallel_step.py's harness, for the
zoo): every process samples the whole global batch from one seed, keeps its own rows and calls
`GRPOTrainer.learn`; the main process saves the gradients the optimizer was about to apply (gathered
whole) and the weights after each step.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.zoo.families import FAMILIES, Family, tiny_config

SHARDED = ("qwen3_5_text", "qwen3_moe")  # a linear-attention hybrid and a mixture of experts


@pytest.mark.parametrize("family", FAMILIES, ids=lambda family: family.name)
def test_every_decoder_block_is_wrapped_and_the_root_keeps_only_the_ends(family: Family) -> None:
    from grpo_cli.training.sharding import decoder_layers

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(tiny_config(family))
    blocks = decoder_layers(model)
    kinds = sorted({type(block).__name__ for block in blocks})
    assert len(blocks) == model.config.num_hidden_layers, f"{family.name}: {kinds}"
    inside = {id(p) for block in blocks for p in block.parameters()}
    ends = {id(p) for m in (model.get_input_embeddings(), model.get_output_embeddings()) for p in m.parameters()}
    # what the root shards: the embeddings, the head and 1-D weights (the final norm); a block class
    # missing from _no_split_modules (a Mamba or an expert layer) would leave its matrices here
    root = [n for n, p in model.named_parameters() if id(p) not in inside | ends and p.dim() > 1]
    assert not root, f"{family.name}: {root} outside the wrapped blocks ({kinds})"


def _config(model_dir: str):  # noqa: ANN202 (imported late: the script's processes pay for it after the launch)
    from grpo_cli.config.schema import ModelConfig, TrainConfig

    cfg = TrainConfig()
    cfg.model = ModelConfig(kind="hf", path=model_dir)
    cfg.train.device, cfg.train.prompts_per_step, cfg.train.steps = "cpu", 2, 2
    cfg.rollout.num_generations, cfg.rollout.max_new_tokens = 4, 6
    cfg.distributed.strategy = "fsdp"  # on one process: unsharded, the update FSDP must reproduce
    cfg.algo.beta = 0.04  # a reference of its own, sharded in place under fsdp
    # off: the router's load-balancing loss is not linear in the batch, so N processes' mean of it is
    # not one process's on the whole batch, with or without sharding (the comparison is of sharding)
    cfg.algo.router_aux_loss_coef = 0.0
    cfg.optim.warmup_steps, cfg.optim.max_grad_norm = 0, 0.0  # the first step moves; raw gradients
    cfg.monitor.plots = False
    return cfg


def main(run_root: str, out: str, *families: str) -> None:
    """Two steps per family ("NAME=DIR"), in this process's share of the world."""
    from torch.distributed.fsdp import FSDPModule

    from grpo_cli.commands.launch import WORKER_ENV, join_world
    from grpo_cli.rollout.base import Rollout
    from grpo_cli.training.pipeline import generate_groups
    from grpo_cli.training.sharding import decoder_layers
    from grpo_cli.training.trainer import GRPOTrainer
    from tests.training.data_parallel_step import whole

    os.environ[WORKER_ENV] = run_root  # every process builds its own config: nothing to broadcast
    results = {}
    for family in families:
        name, model_dir = family.split("=", 1)
        cfg = _config(model_dir)
        world = join_world(cfg, Path(run_root) / name)
        trainer = GRPOTrainer(cfg, Path(run_root) / name, [], world)
        trainer.setup()
        grads: list[list[torch.Tensor]] = []
        trainer.learner.optimizer.register_step_pre_hook(
            lambda opt, args, kwargs, grads=grads: grads.append(
                [whole(p.grad).detach().clone() for group in opt.param_groups for p in group["params"]]
            )
        )
        steps = []
        for step in range(cfg.train.steps):
            batch = trainer.sampler.next_batch(cfg.train.prompts_per_step)
            torch.manual_seed(1234 + step)
            full = generate_groups(batch, trainer.encoder, trainer.generator, cfg.rollout.num_generations)
            per = full.completion_ids.size(0) // world.size
            rows = slice(world.rank * per, (world.rank + 1) * per)
            fields = (full.prompt_ids, full.prompt_mask, full.completion_ids, full.completion_mask, full.truncated)
            mine = Rollout(*(f[rows] for f in fields), full.texts[rows], full.group_size)
            metrics = trainer.learn(batch, mine, time.perf_counter()).metrics
            weights = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
            steps.append({"loss": metrics["loss"], "kl": metrics["kl"], "grads": grads[-1], "weights": weights})
        # the copy the update trains: under fsdp on 2 processes each block and the root are FSDP modules
        wrapped = [type(m).__name__ for m in trainer.learner.model.modules() if isinstance(m, FSDPModule)]
        blocks = [type(m).__name__ for m in decoder_layers(trainer.model)]
        results[name] = {"steps": steps, "processes": world.size, "wrapped": wrapped, "blocks": blocks}
        trainer.cleanup()
    if world.is_main:
        torch.save(results, out)
    if world.size > 1:  # a process group left to the interpreter's exit can abort there
        world.barrier()
        torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def one_and_two(zoo_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """The two processes under `accelerate launch`, and meanwhile the one process in this one."""
    from tests.training.test_data_parallel import _accelerate_launch, _env

    root = tmp_path_factory.mktemp("fsdp_zoo")
    families = [f"{name}={zoo_dirs[name]}" for name in SHARDED]
    command = _accelerate_launch(str(Path(__file__)), str(root / "two"), str(root / "two.pt"), *families)
    two = subprocess.Popen(command, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    with pytest.MonkeyPatch.context() as patch:  # main() marks its process a worker: this one only for now
        patch.setenv("GRPO_WORKER_RUN_DIR", str(root / "one"))
        main(str(root / "one"), str(root / "one.pt"), *families)
    output = two.communicate(timeout=300)[0].decode()
    assert two.returncode == 0, output[-3000:]
    return {name: torch.load(root / f"{name}.pt") for name in ("one", "two")}


@pytest.mark.parametrize("family", SHARDED)
def test_two_sharded_processes_train_what_one_process_trains(one_and_two: dict[str, dict], family: str) -> None:
    one, two = one_and_two["one"][family], one_and_two["two"][family]
    assert (one["processes"], two["processes"]) == (1, 2)
    assert one["wrapped"] == []  # one process: nothing to shard
    # each decoder block sharded one by one (FSDP2 renames the class FSDP<name>), then the root
    assert two["wrapped"][1:] == [f"FSDP{block}" for block in two["blocks"]] and len(two["blocks"]) == 2
    for step, (a, b) in enumerate(zip(one["steps"], two["steps"], strict=True)):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-7), f"step {step}: loss"
        assert b["kl"] == pytest.approx(a["kl"], rel=1e-5, abs=1e-7), f"step {step}: kl"
        for index, (ga, gb) in enumerate(zip(a["grads"], b["grads"], strict=True)):
            torch.testing.assert_close(gb, ga, rtol=1e-5, atol=1e-5, msg=f"step {step}: gradient {index}")
        for name, wa in a["weights"].items():
            torch.testing.assert_close(b["weights"][name], wa, rtol=0, atol=1e-5, msg=f"step {step}: {name}")
    assert one["steps"][1]["kl"] > 0  # the second step ran on a policy the first one moved


if __name__ == "__main__":
    main(*sys.argv[1:])
