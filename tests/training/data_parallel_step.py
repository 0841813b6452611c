"""One trainer step on a fixed global batch, in one process or as one of N (accelerate launch).

Run by tests/training/test_data_parallel.py: `python data_parallel_step.py MODEL_DIR RUN_ROOT OUT
[STRATEGY]` alone, then under `accelerate launch --num_processes 2` with distributed.strategy ddp
and fsdp. Every process generates the whole global batch from one seed (so both runs see the same
completions), keeps its own rows, and calls `GRPOTrainer.learn`, the function `step()` calls after
generating. The main process saves what the optimizer was about to apply (every gradient, gathered
whole, via a step pre-hook) and the step's figures.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

CASES = {  # (algo.scale_rewards, algo.loss_type): the ones whose maths reads the whole batch
    "batch_scaled": ("batch", "grpo"),
    "dapo": ("group", "dapo"),
    "bnpo": ("batch", "bnpo"),
    "entropy_terms": ("group", "dapo"),  # and main()'s high-entropy selection and bonus: the step's tokens
    # luspo's sequence count over both processes and micro-batches; adaptive entropy's measured mean, one for all
    "luspo_adaptive_entropy": ("group", "luspo"),
}


def config(model_dir: str, scale_rewards: str, loss_type: str):
    from grpo_cli.config.schema import ModelConfig, TrainConfig

    cfg = TrainConfig()
    cfg.model = ModelConfig(kind="hf", path=model_dir)
    cfg.train.device, cfg.train.prompts_per_step, cfg.train.steps = "cpu", 4, 1
    cfg.rollout.num_generations, cfg.rollout.max_new_tokens = 4, 6
    cfg.algo.beta, cfg.algo.scale_rewards, cfg.algo.loss_type = 0.04, scale_rewards, loss_type
    # dapo's denominator is the whole batch's tokens, so accumulation must not change it (bnpo's is
    # each micro-batch's: with N processes micro-batch i is the union of every process's i-th one)
    cfg.train.grad_accum_steps = 2 if loss_type == "dapo" else 1
    cfg.optim.warmup_steps = 0  # the first step moves the policy: the second has a KL and ratios != 1
    cfg.optim.max_grad_norm = 0.0  # no clipping: the gradients compared are the raw ones
    cfg.monitor.plots = False
    return cfg


def whole(tensor):
    """A tensor as one process holds it whole: an FSDP2 shard (DTensor) gathered (a collective)."""
    return tensor.full_tensor() if callable(getattr(tensor, "full_tensor", None)) else tensor


def varied_lengths(rollout, trainer):
    """The same rollout with the first half's completions ending (EOS) after 1 to 3 tokens and the
    second half's running to max_new_tokens: the two processes' token counts differ, so a local
    denominator where a global one is due shows."""
    from grpo_cli.rollout.base import finish_rollout

    ids = rollout.completion_ids.clone()
    eos = trainer.tokenizer.eos_token_id
    for row in range(ids.size(0)):
        if row < ids.size(0) // 2:
            ids[row, row % 3] = eos
    g = rollout.group_size
    return finish_rollout(rollout.prompt_ids, rollout.prompt_mask, ids, [eos], trainer.tokenizer, g)


def main(model_dir: str, run_root: str, out: str, strategy: str = "ddp") -> None:
    import torch

    from grpo_cli.commands.launch import WORKER_ENV, join_world
    from grpo_cli.rollout.base import Rollout
    from grpo_cli.training.pipeline import generate_groups
    from grpo_cli.training.trainer import GRPOTrainer

    os.environ[WORKER_ENV] = run_root  # every process builds its own config: nothing to broadcast
    results = {}
    for name, (scale_rewards, loss_type) in CASES.items():
        cfg = config(model_dir, scale_rewards, loss_type)
        cfg.distributed.strategy = strategy
        if name == "entropy_terms":  # the quantile and the mean over every process and micro-batch of the step
            cfg.algo.top_entropy_quantile, cfg.algo.entropy_coef = 0.5, 0.05
        if name == "luspo_adaptive_entropy":  # the coefficient moves on the kept tokens' entropy of both processes
            cfg.algo.ratio_level, cfg.train.grad_accum_steps, cfg.algo.entropy_coef = "sequence", 2, 0.05
            cfg.algo.adaptive_entropy.enabled, cfg.algo.adaptive_entropy.target = True, 100.0  # applied at step 2
        run_dir = Path(run_root) / name
        world = join_world(cfg, run_dir)
        trainer = GRPOTrainer(cfg, run_dir, [], world)
        trainer.setup()
        grads: list[list[torch.Tensor]] = []
        trainer.learner.optimizer.register_step_pre_hook(
            lambda opt, args, kwargs, grads=grads: grads.append(
                [whole(p.grad).detach().clone() for group in opt.param_groups for p in group["params"]]
            )
        )
        steps = []
        for step in range(2):  # the second step has a policy that moved: KL and ratios are not trivial
            batch = trainer.sampler.next_batch(cfg.train.prompts_per_step)
            torch.manual_seed(1234 + step)
            full = varied_lengths(
                generate_groups(batch, trainer.encoder, trainer.generator, cfg.rollout.num_generations), trainer
            )
            per = full.completion_ids.size(0) // world.size
            rows = slice(world.rank * per, (world.rank + 1) * per)
            mine = Rollout(
                full.prompt_ids[rows],
                full.prompt_mask[rows],
                full.completion_ids[rows],
                full.completion_mask[rows],
                full.truncated[rows],
                full.texts[rows],
                full.group_size,
            )
            result = trainer.learn(batch, mine, time.perf_counter())
            keys = ("loss", "kl", "grad_norm", "reward/mean", "reward/std", "entropy", "clip_frac")
            keys += ("entropy/coef",) if cfg.algo.adaptive_entropy.enabled else ()
            steps.append(
                {
                    "metrics": {k: result.metrics[k] for k in keys + ("completion_len/mean",)},
                    "entropy_state": trainer.entropy.state_dict() if cfg.algo.adaptive_entropy.enabled else {},
                    "fused": list(result.fused),
                    "grads": grads[-1],
                    "weights": [p.detach().clone() for p in trainer.model.parameters()],
                }
            )
        results[name] = {"steps": steps, "processes": world.size, "lengths": full.lengths.tolist()}
    if world.is_main:
        torch.save(results, out)
    if world.size > 1:  # a process group left to the interpreter's exit can abort there (std::terminate)
        world.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:5])
