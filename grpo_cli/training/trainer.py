"""The GRPO loop: rollout -> score -> advantage -> update -> observers, one `step()` per batch.

The composition root of training: every stage is a call into its own module, and `step()` reads
top to bottom (nanoGPT-style). Controllers that change the update are explicit calls in `step()`
with their state registered in TrainState; observers only watch.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerState

from grpo_cli.config.env_checks import check_tools_fit
from grpo_cli.config.schema import PrecisionConfig, TrainConfig
from grpo_cli.config.train_checks import validate
from grpo_cli.core.advantages import group_advantages
from grpo_cli.core.clip import AdaptiveClip
from grpo_cli.core.entropy import AdaptiveEntropy
from grpo_cli.core.precision import effective_precision, weights_dtype
from grpo_cli.core.update import policy_update
from grpo_cli.core.update_stats import UpdateTotals
from grpo_cli.cpu_heap import keep_freed_memory, trim_kept_memory
from grpo_cli.data import PromptSampler, check_prompts_per_step, load_examples, split_examples
from grpo_cli.environments import environment_columns, longest_prompt
from grpo_cli.evaluation import SuccessRule
from grpo_cli.models import empty_device_cache, frozen_reference, load_policy, pick_device, set_cpu_threads
from grpo_cli.monitor import Observer, StepResult
from grpo_cli.monitor.observer import StageReport, ignore_stage
from grpo_cli.monitor.resources import peak_memory_mib
from grpo_cli.rewards import (
    EnvironmentDown,
    NoRewardLeft,
    RewardExecutor,
    RewardFusion,
    check_columns,
    resolve_reward_sources,
    reward_diagnostics,
)
from grpo_cli.rollout import Rollout, make_generator, with_sampling_weights
from grpo_cli.rollout.episodes import with_environment
from grpo_cli.rollout.prompts import PromptEncoder, context_length
from grpo_cli.stats import nanmean
from grpo_cli.training.alerts import StepAlerts
from grpo_cli.training.async_pipeline import AsyncRollouts, SampledBatch, split_cores
from grpo_cli.training.checkpointing import Policy, RunCheckpoints
from grpo_cli.training.curriculum import RewardCurriculum
from grpo_cli.training.distributed import World, check_divisible
from grpo_cli.training.dynamic_sampling import DynamicSampler, ScoredBatch, fit_mini_batches
from grpo_cli.training.episode_rows import agreed_width, update_batch
from grpo_cli.training.guards import GuardVerdict, StabilityGuard, TrainingHalted
from grpo_cli.training.interrupt import DeferredInterrupt, Interrupted, missed
from grpo_cli.training.layout import router_aux_coefficient, training_layout
from grpo_cli.training.learner import build_learner
from grpo_cli.training.metrics import environment_alert, step_metrics, step_samples, unanswered_turns_alert
from grpo_cli.training.pipeline import (
    async_sampler,
    evaluate_greedy,
    fit_to_model,
    generate_groups,
    score_rollout,
)
from grpo_cli.training.sharding import gather_into, log_training_state
from grpo_cli.training.state import RngState, TrainState, seed_everything

log = logging.getLogger("grpo")
EVAL_PROMPTS = 64  # held-out prompts per evaluation: a stable figure at a small cost


class GRPOTrainer:
    """setup() validates and loads everything; train() loops step(); save() writes an atomic checkpoint."""

    state_logged = False  # the training state's bytes per process are logged once, after the first update

    def __init__(
        self, cfg: TrainConfig, run_dir: Path, observers: list[Observer] | None = None, world: World | None = None
    ) -> None:
        self.cfg = cfg
        self.world = world if world is not None else World.single()  # data-parallel: this process's place
        self.run_dir = Path(run_dir)
        self.observers = list(observers or [])
        self.step_index = 0
        self.history: list[dict[str, Any]] = []
        self.resumed_from: Path | None = None
        self.state = TrainState()
        self.checkpoints = RunCheckpoints(cfg, self.run_dir, self.world)
        self.interrupts = DeferredInterrupt()
        self.report_stage: StageReport = ignore_stage  # what the step is doing now (commands/train.py: the console)
        self.sampling_stage = "sampling"  # what the generator's tokens are for: "evaluating" during train.eval_every

    # ---- setup -------------------------------------------------------------------------
    def setup(self) -> None:
        cfg = self.cfg
        for warning in validate(cfg):
            log.warning(warning)
        check_divisible(cfg.train.prompts_per_step, self.world.size)
        seed_everything(cfg.train.seed)
        # data-parallel: accelerate gives each process its device (cuda:LOCAL_RANK, or the CPU)
        self.device = self.world.device if self.world.size > 1 else pick_device(cfg.train.device)
        set_cpu_threads(cfg.train.threads, cfg.model.kind, self.device)
        heap = keep_freed_memory(cfg.train.cpu_heap, self.device)  # before any model: its tensors come from it too
        # Reward functions resolve first: a wrong import path fails before any model loads.
        # what a TRL-style reward reads as trainer_state (transformers' class, TRL's), moved on in step()
        self.trainer_state = TrainerState(max_steps=cfg.train.steps, logging_steps=cfg.monitor.print_every)
        self.reward_sources = resolve_reward_sources(
            cfg.reward.functions, cfg.train.device, cfg.sandbox, cfg.data.chat, self.trainer_state
        )
        self.success = SuccessRule.resolve([s.name for s in self.reward_sources], cfg.eval)  # a typo fails here
        self.curriculum = RewardCurriculum(cfg.curriculum, cfg.reward.functions, cfg.train.steps)
        train_examples, eval_examples = split_examples(load_examples(cfg.data), cfg.data.eval_fraction, cfg.data.seed)
        check_prompts_per_step(cfg.train.prompts_per_step, len(train_examples), len(eval_examples))  # before any model
        data_columns = list({k for ex in train_examples for k in ex if k != "prompt"})
        # env.*: the environment builds, and the data holds what it needs (code_feedback's tests, chat for tools)
        check_columns(self.reward_sources, data_columns + environment_columns(cfg.env, cfg.sandbox, train_examples))
        # e.g. the sandbox backend: shown at start-up, in every metrics line and in the summary
        self.diagnostics = reward_diagnostics(self.reward_sources) | ({"cpu_heap": heap} if heap else {})
        self.reward_fusion = RewardFusion.from_config(self.reward_sources, cfg.reward)
        self.reward_executor = RewardExecutor(cfg.reward.num_workers, cfg.reward.timeout_s)
        self.resumed_from = self.checkpoints.resume_point()  # before any model: a changed config fails at once
        precision, notice = effective_precision(cfg.precision, self.device)
        if notice:
            log.warning(notice)
        with self.world.main_first():  # the tiny model is built and saved once, then read by the others
            self.model, self.tokenizer, self.model_dir = load_policy(
                cfg.model, self.run_dir, cfg.train.seed, self.device, weights_dtype(precision), self.resumed_from
            )
        # No reference model is built or run when beta = 0; a resumed run reloads the starting model.
        starting_dir = self.model_dir if self.resumed_from else None
        reference = frozen_reference(self.model, starting_dir) if cfg.algo.beta > 0 else None
        self.build_sampling()
        prompts = [ex["prompt"] for ex in train_examples]  # env.*: every prompt keeps the tools' description
        check_tools_fit(cfg, context_length(self.model), self.encoder, prompts)
        splits, self.prompt_budget = fit_to_model(
            {"train": train_examples, "eval": eval_examples}, self.encoder, self.model, cfg.data, cfg.rollout
        )
        self.train_examples, self.eval_examples = splits["train"], splits["eval"]
        skipped = len(train_examples) - len(self.train_examples)  # data.on_long_prompt=skip may leave too few
        check_prompts_per_step(cfg.train.prompts_per_step, len(self.train_examples), len(eval_examples), skipped)
        self.sampler = PromptSampler(self.train_examples, cfg.train.seed)
        self.rollouts = self.build_async_rollouts() if cfg.rollout.max_staleness > 0 else None
        sampling = self.sampler, self.encoder, self.generator, self.reward_executor, self.reward_fusion, self.world
        # algo.dynamic_sampling (DAPO): more draws from the same sampler while a step's groups are constant
        self.refill = (
            DynamicSampler(cfg, *sampling, self.tokenizer.pad_token_id) if cfg.algo.dynamic_sampling.enabled else None
        )
        self.build_learner(reference, precision)
        self.build_step_state()
        self.step_index, self.history = self.checkpoints.start(self.resumed_from, self.learner, self.state)

    def build_learner(self, reference: torch.nn.Module | None, precision: PrecisionConfig) -> None:
        """The update's moving parts, its passes fitted to this model once: the layout (and why, a
        start-up line) and the router loss's coefficient (training.layout)."""
        cfg = self.cfg
        router_aux = router_aux_coefficient(cfg.algo.router_aux_loss_coef, self.model)
        layout, self.diagnostics["train_layout"] = training_layout(cfg.train.layout, self.model, router_aux)
        self.learner, self.update_settings, self.lr = build_learner(
            self.model, reference, cfg, precision, self.world, self.device, layout, router_aux
        )

    def build_step_state(self) -> None:
        """What every step reads and a checkpoint carries beside the weights: the adaptive clip and
        entropy, the guard, the RNG, the sampler's and the fusion's state; and the step's alerts."""
        cfg = self.cfg
        self.clip = AdaptiveClip(cfg.algo.adaptive_clip, cfg.algo.epsilon_low, cfg.algo.epsilon_high)
        self.entropy = AdaptiveEntropy(cfg.algo.adaptive_entropy, cfg.algo.entropy_coef)  # algo.adaptive_entropy
        self.guard = StabilityGuard(cfg.guard)
        self.halt: GuardVerdict | None = None  # a guard's pause or stop, carried out once the step is saved
        self.phase_announced = False  # the first step this process runs names the curriculum phase
        # rollout.max_staleness: the pipeline saves the prompts' state as of the learner's step, not the sampler's
        prompts = self.rollouts if self.rollouts is not None else self.sampler
        parts = {"rng": RngState(), "sampler": prompts, "fusion": self.reward_fusion, "guard": self.guard}
        if self.entropy.enabled:  # only then: a checkpoint from before it existed resumes as it was
            parts["entropy"] = self.entropy
        for name, part in {**parts, "clip": self.clip}.items():
            self.state.register(name, part)
        self.alerts = StepAlerts(cfg.monitor, self.success.name, self.state, self.samples_from_copy)

    def build_sampling(self) -> None:
        """The sampling loop `rollout.*` picks, run in turns with the environment when `env.*` names
        one, and the prompt encoder, which offers the environment's tools."""
        cfg = self.cfg
        longest = longest_prompt(cfg.data.max_prompt_tokens, cfg.env, cfg.rollout.max_new_tokens)  # vLLM's context
        generator, self.diagnostics["rollout_loop"] = make_generator(self.model, self.tokenizer, cfg.rollout, longest)
        self.sampler_side = None  # rollout.max_staleness: the sampler's thread samples with its own weights
        if cfg.rollout.max_staleness > 0:
            self.sampler_side = async_sampler(self.model, self.tokenizer, generator, cfg, context_length(self.model))
            self.samples_from_copy, weights = self.sampler_side.bf16, self.sampler_side.weights
        else:
            generator, self.samples_from_copy, weights = with_sampling_weights(
                generator, self.model, self.tokenizer, cfg.rollout
            )
        if weights is not None:
            self.diagnostics["sampling_weights"] = weights
        generator.on_token = lambda done, total: self.report_stage(self.sampling_stage, done, total)
        self.encoder = PromptEncoder(
            self.tokenizer, cfg.data.max_prompt_tokens, self.device, cfg.data.chat_template_kwargs
        )
        self.generator, environment = with_environment(
            generator, self.encoder, self.tokenizer, cfg.env, cfg.sandbox, cfg.rollout, context_length(self.model)
        )
        if environment is not None:
            self.diagnostics["environment"] = environment

    def build_async_rollouts(self) -> AsyncRollouts:
        """rollout.max_staleness >= 1: a sampler of its own (weights, tokenizer, encoder, environment)
        in a thread of its own, `k` policy versions behind the update (training/async_pipeline.py)."""
        cfg, world, g, side = self.cfg, self.world, self.cfg.rollout.num_generations, self.sampler_side
        assert side is not None  # build_sampling made it: rollout.max_staleness > 0
        # the prompt budget fit_to_model set on the learner's encoder after build_sampling: the sampler cuts the same
        side.encoder.max_tokens, side.encoder.on_long_prompt = self.encoder.max_tokens, self.encoder.on_long_prompt

        def sample(step: int, examples: list[dict[str, Any]]) -> Rollout:
            side.generator.set_step_seed(world.sampling_seed(cfg.train.seed, step))  # its own stream, per batch
            return generate_groups(world.share(examples), side.encoder, side.generator, g)

        # the fast loop samples on this process's cores, a colocated engine beside it (vllm.local_rank_cores binds
        # it the sampler's half); a server samples elsewhere, and data-parallel processes already share the cores
        here = cfg.rollout.backend == "hf" or (cfg.rollout.vllm.mode == "colocated" and world.size == 1)
        split = split_cores(self.device, cfg.train.threads) if here else None
        k = cfg.rollout.max_staleness
        per_step = cfg.train.prompts_per_step
        # data-parallel, each process's batches differ and the checkpoint holds the main one's state: they do not travel
        carry = world.size == 1
        settings = json.dumps([asdict(cfg.rollout), asdict(cfg.data), per_step], sort_keys=True, default=str)
        rollouts = AsyncRollouts(
            sample, side.refresh, self.sampler, per_step, k, cfg.train.steps, split, carry, settings
        )
        where = f"; {split.describe()}" if split is not None else ""
        self.diagnostics["async"] = f"rollout.max_staleness={k}: batch j sampled by the policy of step j-{k}{where}"
        return rollouts

    def log_training_state(self) -> None:
        self.state_logged = True
        if self.world.is_main:
            strategy, sharded = self.cfg.distributed.strategy, self.checkpoints.sharded
            log_training_state(self.learner.model, self.learner.optimizer, strategy, self.world.size, sharded)

    def step(self) -> StepResult:
        cfg, g, world = self.cfg, self.cfg.rollout.num_generations, self.world
        t0 = time.perf_counter()
        if world.size > 1:
            torch.manual_seed(world.sampling_seed(cfg.train.seed, self.step_index))
        if self.rollouts is None:  # the asynchronous sampler seeds its own batches
            self.generator.set_step_seed(world.sampling_seed(cfg.train.seed, self.step_index))  # vLLM: per request
        self.trainer_state.global_step = self.step_index  # optimizer steps taken, as TRL's rewards see it
        self.trainer_state.epoch = self.step_index * cfg.train.prompts_per_step / len(self.train_examples)
        self.report_stage("sampling", 0, 0)  # the fast loop then counts its tokens (Generator.on_token)
        if self.rollouts is not None:  # rollout.max_staleness: sampled ahead, in the sampler's thread
            sampled = self.rollouts.take(self.step_index)
            return self.learn(sampled.examples, sampled.rollout, t0, sampled)
        if self.refill is not None:  # algo.dynamic_sampling: rounds until the groups carry a signal
            return self.train_on(self.refill.fill(self.curriculum.weights(self.step_index)), t0)
        batch = self.sampler.next_batch(cfg.train.prompts_per_step)  # the global batch: the same in every process
        rollout = generate_groups(world.share(batch), self.encoder, self.generator, g)  # this process's prompts
        return self.learn(batch, rollout, t0)

    def learn(
        self, batch: list[dict[str, Any]], rollout: Rollout, started: float, sampled: SampledBatch | None = None
    ) -> StepResult:
        """Score, advantages, update and the step's figures, for this process's `rollout` of its
        share of `batch` (the step's global prompts); `started` is when the step began. `sampled`:
        the asynchronous sampler's batch (its staleness and generation time)."""
        t_gen = time.perf_counter()
        weights = self.curriculum.weights(self.step_index)  # curriculum: by progress through train.steps
        combine = self.world.gather_scores if self.world.size > 1 else None  # fuse the global batch's scores
        examples = self.world.share(batch)
        self.report_stage("scoring", 0, 0)
        fusion = score_rollout(examples, rollout, self.reward_executor, self.reward_fusion, weights, combine=combine)
        timings = {"generate": t_gen - started, "score": time.perf_counter() - t_gen}
        metrics = {}
        if sampled is not None:  # generation ran beside the last update: its own time, and the learner's wait
            timings |= {"generate": sampled.generate_s, "wait": t_gen - started}
            metrics = {"async/staleness": float(sampled.staleness()), "async/version": float(sampled.version)}
        return self.train_on(ScoredBatch(batch, rollout, fusion, timings, metrics=metrics), started)

    def train_on(self, scored: ScoredBatch, started: float) -> StepResult:
        """Advantages, update and the step's figures for a scored batch; `started`: when the step began."""
        cfg, g, world = self.cfg, self.cfg.rollout.num_generations, self.world
        batch, rollout, fusion = scored.examples, scored.rollout, scored.fusion
        t_score = time.perf_counter()
        phase = self.curriculum.announcement(self.step_index, first=not self.phase_announced)
        self.phase_announced = True
        rewards = torch.tensor(fusion.fused, dtype=torch.float32)
        # the policy's progress in the rewards' own units (every generated group, fixed weights): what the
        # clip, the guard, the hacking alert and the sweep objective read
        generated = scored.generated or fusion
        raw = generated.raw
        advantages, adv_stats = group_advantages(rewards, g, cfg.algo.scale_rewards)

        scores, here = (world.rows(x).to(self.device) for x in (rewards, advantages))  # scores NaN: unscorable
        width = agreed_width(rollout, world, cfg.env)  # env.token_mode, env=agent: an episode may train several rows
        rows = update_batch(rollout, here, scores, cfg.algo.mask_truncated, self.tokenizer.pad_token_id, width)
        lr = self.learner.schedule_step(self.step_index)  # by step index, as the curriculum's weights
        epsilons = self.clip.epsilons(nanmean(raw))  # adaptive clipping: this batch against the last ones
        if scored.trains:
            update = policy_update(
                self.learner,
                rows,
                fit_mini_batches(cfg.algo, len(batch) // world.size),  # a short batch may hold fewer groups
                self.update_settings,
                epsilons=epsilons,
                on_first_step=self.interrupts.arm,  # from here a Ctrl-C waits for the step's observers
                on_micro_batch=lambda done, total: self.report_stage("training", done, total),
                entropy_control=self.entropy,
            )
        else:  # dynamic sampling found no group with a signal: nothing to learn from, the weights stay
            update = UpdateTotals().stats(self.learner.collective, with_kl=self.learner.reference is not None)
        self.share_weights(moved=update.optimizer_steps > 0)
        trim_kept_memory()  # train.cpu_heap=auto: kept memory past its bound goes back (cpu_heap)
        t_train = time.perf_counter()
        self.interrupts.arm()  # even when every update was skipped: the step's outcome is final now
        verdicts = self.guard.observe(raw, update.optimizer_steps, update.skipped_updates)  # pause/stop: once saved
        self.halt = next((v for v in verdicts if v.action in ("pause", "stop")), None)

        self.step_index += 1
        timings = {**scored.timings, "train": t_train - t_score, "step": t_train - started}
        if self.rollouts is not None:  # the hand-off (the wait for the sampler, its weights' refresh) on its own
            handoff = self.rollouts.handoff_s
            timings |= {"train": timings["train"] - handoff, "handoff": handoff}
        rollout = world.gather_rollout(rollout, self.tokenizer.pad_token_id)  # the global batch's, for the figures
        figures = adv_stats, update, rollout, lr, timings, self.diagnostics, peak_memory_mib(self.device)
        metrics = step_metrics(self.step_index, fusion, generated, *figures)
        metrics.update({"clip/epsilon_low": epsilons[0], "clip/epsilon_high": epsilons[1], **scored.metrics})
        if self.entropy.enabled:  # the coefficient after this step's updates (TRL's entropy_coef)
            metrics["entropy/coef"] = self.entropy.coef
        metrics.update(self.guard.metrics(raw))
        if self.rollouts is not None:
            metrics.update(self.rollouts.step_figures(timings["step"]))
        samples = step_samples(batch, rollout, fusion, advantages.tolist(), 2 * g)
        alerts = scored.alerts + self.alerts.observe(fusion, verdicts, metrics)
        env_alerts = [environment_alert(rollout, cfg.env), unanswered_turns_alert(rollout, cfg.env)]
        alerts += [line for line in env_alerts if line is not None]
        events = [phase] if phase is not None else []
        return StepResult(self.step_index, metrics, samples, alerts, fusion.per_function, fusion.fused, events)

    def share_weights(self, moved: bool) -> None:
        """After the update (`moved`: it applied one): the whole module gathered (fsdp), the training
        state logged once, and whatever samples next given the weights: a generator's own copy (vLLM,
        the bf16 copy), or the asynchronous sampler at its hand-off, which counts every step."""
        if moved:
            if self.checkpoints.sharded:  # distributed.strategy=fsdp: the whole module samples and saves
                gather_into(self.learner.model, self.model)
            if not self.state_logged:  # the first update of this process: the optimizer state now exists
                self.log_training_state()
            if self.rollouts is None:
                self.generator.weights_updated()  # a generator with its own copy of the weights (vLLM) refreshes it
        if self.rollouts is not None:  # the sampler takes this version once done with the last batch of the previous
            self.rollouts.publish(self.step_index + 1)

    @torch.no_grad()
    def evaluate(self, limit: int = EVAL_PROMPTS) -> dict[str, float]:
        """Greedy answers on the held-out split, as `grpo eval` computes its greedy/* figures, under
        `eval/`; the fusion's running state is left alone."""
        weights = self.curriculum.weights(max(self.step_index - 1, 0))  # those of the step just trained
        scoring = self.reward_executor, self.reward_fusion, self.success
        metrics = evaluate_greedy(self.eval_examples[:limit], self.encoder, self.generator, *scoring, limit, weights)
        return {f"eval/{name}": value for name, value in metrics.items()}

    # ---- the loop ----------------------------------------------------------------------
    def train(self) -> list[dict[str, Any]]:
        """A step is finished when its observers have run (and its checkpoint, if due, is written).

        Ctrl-C or SIGTERM (`training/interrupt.py`) before the weights move rolls the step back and
        saves the last finished step; once they move, it is deferred to the end of the step, which is
        then saved. A second Ctrl-C inside that window stops at once, and the previous checkpoint is
        the one to resume from. Data-parallel, every signal waits for the end of the step, where the
        processes agree to save it and stop together.
        """
        with self.interrupts.loop(data_parallel=self.world.size > 1):
            while self.step_index < self.cfg.train.steps:
                self._train_step()
        return self.history

    def _train_step(self) -> None:
        """One step of `train()`, finished or rolled back."""
        cfg = self.cfg
        finished = True  # between steps the live state is the last finished step
        try:
            if (dropped := missed()) is not None:  # a signal raised where Python dropped it: obeyed here
                raise Interrupted(dropped)
            start = self.state.state_dict()
            self.interrupts.engaged = finished = False
            with self.interrupts:
                result = self.step()
                evaluating = cfg.train.eval_every and self.step_index % cfg.train.eval_every == 0
                if evaluating and self.eval_examples and self.world.is_main:  # the main process reports it
                    self.sampling_stage = "evaluating"
                    result.metrics.update(self.evaluate())
                    self.sampling_stage = "sampling"
                self.history.append(result.metrics)
                for observer in self.observers:
                    observer.on_step(result)
                if cfg.train.save_every and self.step_index % cfg.train.save_every == 0:
                    self.save()
                if cfg.train.empty_cache_every and self.step_index % cfg.train.empty_cache_every == 0:
                    empty_device_cache(self.device)  # the step's generation and update blocks, before the next
                finished = True
            stop = self.interrupts.agreed(self.world)  # data-parallel: every process, at the same point
            if stop is not None:
                self.save()
                raise Interrupted(stop)
            if self.halt is not None:  # a guard's pause or stop: the finished step is the checkpoint
                raise TrainingHalted(self.halt, self.step_index, str(self.save()))
        except NoRewardLeft as err:  # scoring, before the weights move: the last finished step is saved
            self.state.load_state_dict(start)
            raise NoRewardLeft(
                f"{err}; step {self.step_index} is saved in {self.save()}: "
                f"{'fix it' if isinstance(err, EnvironmentDown) else 'fix them'}, then resume"
            ) from None
        except KeyboardInterrupt:
            missed()  # this one is handled
            if self.world.size > 1:  # saved above when agreed; else (a second Ctrl-C) the last checkpoint
                raise
            if not finished and not self.interrupts.engaged:  # the weights never moved: undo the step
                self.state.load_state_dict(start)
                self.learner.optimizer.zero_grad(set_to_none=True)
            if finished or not self.interrupts.engaged:
                self.save()
            raise

    def save(self) -> Path:
        policy = Policy(self.model, self.tokenizer, self.model_dir)
        return self.checkpoints.save(self.step_index, policy, self.learner, self.state)

    def cleanup(self) -> None:
        """Free the models so the next job of a multirun starts from an empty process."""
        if hasattr(self, "rollouts") and self.rollouts is not None:
            self.rollouts.close()  # the sampler's thread first: it may be using the generator
        if hasattr(self, "reward_executor"):
            self.reward_executor.close()  # worker processes end with the job, not the interpreter
        if hasattr(self, "generator"):
            self.generator.close()  # a vLLM engine's processes too
        names = ("model", "learner", "generator", "reward_executor", "reward_fusion", "reward_sources")
        for name in (*names, "rollouts", "sampler_side"):  # the sampler's weights too
            if hasattr(self, name):
                delattr(self, name)
        if hasattr(self, "device"):
            empty_device_cache(self.device)
