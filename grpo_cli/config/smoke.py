"""The smoke-mode shrink (debug.smoke=true): any composed train config cut to seconds of work.

Not a check, so apart from them: it rewrites the config before the checks see it.
"""

from __future__ import annotations

from grpo_cli.config.schema import TrainConfig


def apply_smoke(cfg: TrainConfig) -> None:
    """Shrink any composed config to seconds of work, keeping its data, rewards and algorithm.

    Done in code rather than YAML so it wins over whatever a recipe sets, in any merge order.
    """
    d = cfg.debug
    cfg.model.kind = "tiny"
    cfg.model.path = None
    cfg.model.gguf_file = None
    cfg.model.package = None
    cfg.model.dtype = "auto"
    cfg.precision.dtype = "fp32"
    cfg.precision.autocast = False
    cfg.train.steps = d.steps
    cfg.monitor.plots = False  # two steps draw no curve; the pictures would cost more than the run
    cfg.train.prompts_per_step = d.prompts_per_step
    cfg.train.grad_accum_steps = 1
    cfg.train.save_every = 0
    cfg.train.eval_every = 0
    cfg.train.device = "cpu"
    cfg.rollout.num_generations = d.num_generations
    cfg.rollout.max_new_tokens = d.max_new_tokens
    cfg.data.max_examples = d.max_examples
    cfg.data.max_prompt_tokens = min(cfg.data.max_prompt_tokens, 128)
    cfg.algo.mini_batches = min(cfg.algo.mini_batches, max(1, d.prompts_per_step // cfg.distributed.num_processes))
