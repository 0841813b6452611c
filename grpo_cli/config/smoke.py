"""The smoke-mode shrink (debug.smoke=true): any composed train config cut to seconds of work.

Not a check, so apart from them: it rewrites the config before the checks see it.
"""

from __future__ import annotations

from grpo_cli.config.schema import ModelConfig, PrecisionConfig, TrainConfig


def apply_smoke(cfg: TrainConfig) -> None:
    """Shrink any composed config to seconds of work, keeping its data, rewards and algorithm.

    Done in code rather than YAML so it wins over whatever a recipe sets, in any merge order.
    """
    d = cfg.debug
    # The default tiny model and fp32, keeping only the model keys every kind reads: a recipe's hf-only
    # keys (model.path, trust_remote_code, ...) would otherwise be refused as ignored by model=tiny.
    model = cfg.model
    cfg.model = ModelConfig(
        tiny=model.tiny if model.kind == "tiny" else ModelConfig().tiny,  # a tiny recipe's own size
        gradient_checkpointing=model.gradient_checkpointing,
        lm_head_fp32=model.lm_head_fp32,
        disable_dropout=model.disable_dropout,
        lora=model.lora,
    )
    cfg.precision = PrecisionConfig()
    cfg.train.steps = d.steps
    cfg.monitor.plots = False  # two steps draw no curve; the pictures would cost more than the run
    cfg.train.prompts_per_step = d.prompts_per_step
    cfg.train.grad_accum_steps = 1
    cfg.train.save_every = 0
    cfg.train.eval_every = 0
    cfg.train.device = "cpu"
    cfg.rollout.num_generations = d.num_generations
    cfg.rollout.max_new_tokens = d.max_new_tokens
    cfg.rollout.min_new_tokens = min(cfg.rollout.min_new_tokens, d.max_new_tokens)  # within the new length
    cfg.data.max_examples = d.max_examples
    cfg.data.max_prompt_tokens = min(cfg.data.max_prompt_tokens, 128)
    cfg.algo.mini_batches = min(cfg.algo.mini_batches, max(1, d.prompts_per_step // cfg.distributed.num_processes))
