"""The GRPO loop: rollout -> score -> advantage -> update, one `step()` per batch of prompts.

Readable top to bottom, nanoGPT-style; each stage is a call into its own module.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from grpo_cli.config.schema import TrainConfig
from grpo_cli.core.advantages import group_advantages
from grpo_cli.core.checkpoint import load_checkpoint_state, resume_point, save_checkpoint
from grpo_cli.core.logprobs import completion_logprobs
from grpo_cli.core.loss import (
    LossNormalizer,
    aggregate_loss,
    clipped_surrogate,
    importance_ratio,
    kl_penalty,
)
from grpo_cli.core.optim import build_optimizer
from grpo_cli.data import PromptSampler, load_examples, split_examples
from grpo_cli.models import frozen_reference, load_policy
from grpo_cli.rewards import (
    RewardExecutor,
    RewardFusion,
    check_columns,
    resolve_reward_sources,
    reward_diagnostics,
    score_and_fuse,
)
from grpo_cli.rollout import HFGenerator, Rollout

StepCallback = Callable[[dict[str, Any]], None]
PRECISION_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def seed_everything(seed: int) -> None:
    """Called at the start of every job: a multirun runs all jobs in one process."""
    random.seed(seed)
    torch.manual_seed(seed)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _nanmean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else math.nan


def _nanstd(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    if len(finite) < 2:
        return 0.0
    mean = sum(finite) / len(finite)
    return math.sqrt(sum((v - mean) ** 2 for v in finite) / (len(finite) - 1))


class GRPOTrainer:
    """setup() loads everything; train() loops step(); save() writes an atomic checkpoint."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, callbacks: list[StepCallback] | None = None) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.callbacks = callbacks or []
        self.step_index = 0
        self.history: list[dict[str, Any]] = []
        self.resumed_from: Path | None = None
        self._step_start: dict[str, Any] | None = None  # state before the step in flight
        self._weights_moved = False  # an optimizer step of the step in flight has happened

    # ---- setup -------------------------------------------------------------------------
    def setup(self) -> None:
        cfg = self.cfg
        seed_everything(cfg.train.seed)
        if cfg.train.threads > 0:
            torch.set_num_threads(cfg.train.threads)
        elif cfg.model.kind == "tiny" and pick_device(cfg.train.device).type == "cpu":
            torch.set_num_threads(1)  # tiny ops are too small to split; threads only contend
        # Reward functions resolve first: a wrong import path fails before any model loads.
        self.reward_sources = resolve_reward_sources(
            cfg.reward.functions, device=cfg.train.device, sandbox=getattr(cfg, "sandbox", None)
        )
        self.train_examples, self.eval_examples = split_examples(
            load_examples(cfg.data), cfg.data.eval_fraction, cfg.data.seed
        )
        check_columns(self.reward_sources, list({k for ex in self.train_examples for k in ex if k != "prompt"}))
        # e.g. the sandbox backend: shown at start-up, in every metrics line and in the summary
        self.reward_diagnostics = reward_diagnostics(self.reward_sources)
        self.reward_fusion = RewardFusion(
            self.reward_sources,
            getattr(cfg.reward, "max_consecutive_failures", 3),
            getattr(cfg.reward, "aggregation", "weighted_mean"),
        )
        self.reward_executor = RewardExecutor(
            getattr(cfg.reward, "num_workers", 0), getattr(cfg.reward, "timeout_s", 60.0)
        )
        self.sampler = PromptSampler(self.train_examples, cfg.train.seed)
        self.device = pick_device(cfg.train.device)
        self.resumed_from = resume_point(cfg.train.resume, self.run_dir)
        self.model, self.tokenizer, self.model_dir = load_policy(
            cfg.model,
            self.run_dir,
            cfg.train.seed,
            self.device,
            "fp32" if cfg.precision.autocast else cfg.precision.dtype,
            weights_dir=self.resumed_from,
        )
        # No reference model is built or run when beta = 0.
        starting_dir = self.model_dir if self.resumed_from else None
        self.reference = frozen_reference(self.model, starting_dir) if cfg.algo.beta > 0 else None
        self.generator = HFGenerator(self.model, self.tokenizer, cfg.rollout)
        updates_per_step = cfg.algo.num_iterations * cfg.algo.mini_batches
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg.optim, cfg.train.steps * updates_per_step)
        if self.resumed_from is not None:
            self._restore(self.resumed_from)
        else:  # a fresh start in a used run directory must not append to an older run's lines
            truncate_metrics(self.run_dir / "metrics.jsonl", 0)

    def _autocast(self) -> contextlib.AbstractContextManager:
        if not self.cfg.precision.autocast or self.cfg.precision.dtype == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=PRECISION_DTYPES[self.cfg.precision.dtype])

    # ---- stages ------------------------------------------------------------------------
    def _encode_prompts(self, prompts: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Conversational prompts go through the chat template; plain strings are used as-is."""
        conversational = [isinstance(p, list) for p in prompts]
        texts = [
            self.tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) if conv else p
            for p, conv in zip(prompts, conversational)
        ]
        enc = self.tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=not any(conversational))
        ids, mask = enc["input_ids"], enc["attention_mask"]
        limit = self.cfg.data.max_prompt_tokens
        if ids.size(1) > limit:  # keep the end of the prompt: that is where the question is
            ids, mask = ids[:, -limit:], mask[:, -limit:]
        return ids.to(self.device), mask.to(self.device)

    def _score(
        self, examples: list[dict[str, Any]], rollout: Rollout, g: int, update_state: bool = True
    ) -> tuple[torch.Tensor, dict[str, list[float]]]:
        """update_state=False for eval: held-out batches must not move EMA stats or failure counts."""
        prompts = [ex["prompt"] for ex in examples for _ in range(g)]
        column_names = list(dict.fromkeys(k for ex in examples for k in ex if k != "prompt"))  # rows may differ
        columns = {k: [ex.get(k) for ex in examples for _ in range(g)] for k in column_names}
        columns["completion_lengths"] = rollout.lengths.tolist()  # token counts, EOS included (overlong)
        weights = {s.name: s.weight for s in self.reward_sources}  # curriculum=constant
        result = score_and_fuse(
            self.reward_executor,
            self.reward_fusion,
            prompts,
            rollout.texts,
            columns,
            g,
            weights,
            update_state=update_state,
        )
        if update_state:
            self.last_fusion = result  # alerts, masks, NaN indices, weight effect: for the metrics
        return torch.tensor(result.fused, dtype=torch.float32), result.per_function

    @torch.no_grad()
    def _logprobs_no_grad(self, model: torch.nn.Module, r: Rollout, rows: torch.Tensor) -> torch.Tensor:
        chunks = []
        micro = max(1, math.ceil(len(rows) / self.cfg.train.grad_accum_steps))
        for idx in rows.split(micro):
            with self._autocast():
                chunks.append(
                    completion_logprobs(
                        model,
                        r.prompt_ids[idx],
                        r.prompt_mask[idx],
                        r.completion_ids[idx],
                        r.completion_mask[idx],
                        self.cfg.rollout.temperature,
                    )
                )
        return torch.cat(chunks)

    def _update(self, r: Rollout, advantages: torch.Tensor, loss_mask: torch.Tensor) -> dict[str, float]:
        """num_iterations passes over mini-batches of whole groups; one optimizer step each."""
        cfg, g = self.cfg, self.cfg.rollout.num_generations
        n = advantages.size(0)
        all_rows = torch.arange(n, device=self.device)
        # Stored behaviour log-probs only when the policy moves before the last update; with a
        # single update old = stop_gradient(lp), which costs no extra forward pass.
        reuse = cfg.algo.num_iterations > 1 or cfg.algo.mini_batches > 1
        old_logps = self._logprobs_no_grad(self.model, r, all_rows) if reuse else None
        ref_logps = self._logprobs_no_grad(self.reference, r, all_rows) if self.reference is not None else None
        totals = {"loss": 0.0, "kl": 0.0, "clip_low": 0.0, "clip_high": 0.0, "tokens": 0.0, "grad_norm": 0.0}
        updates = skipped = 0
        num_groups = n // g
        for _ in range(cfg.algo.num_iterations):
            group_order = torch.randperm(num_groups)
            for groups in group_order.chunk(cfg.algo.mini_batches):
                rows = (groups.unsqueeze(1) * g + torch.arange(g)).reshape(-1).to(self.device)
                mask_mb = loss_mask[rows]
                # chunk() may return fewer pieces than asked (6 rows in 4 -> 3): count real ones.
                micro_batches = rows.chunk(cfg.train.grad_accum_steps)
                norm = LossNormalizer(
                    loss_type=cfg.algo.loss_type,
                    sequences=int((mask_mb.sum(-1) > 0).sum()),
                    tokens=int(mask_mb.sum()),
                    max_new_tokens=cfg.rollout.max_new_tokens,
                    micro_batches=len(micro_batches),
                )
                step_loss = 0.0
                for micro in micro_batches:
                    with self._autocast():
                        logps = completion_logprobs(
                            self.model,
                            r.prompt_ids[micro],
                            r.prompt_mask[micro],
                            r.completion_ids[micro],
                            r.completion_mask[micro],
                            cfg.rollout.temperature,
                        )
                    old = old_logps[micro] if old_logps is not None else logps.detach()
                    mask = loss_mask[micro]
                    ratio = importance_ratio(logps, old, mask, cfg.algo.ratio_level)
                    per_token, low, high = clipped_surrogate(
                        ratio, advantages[micro], cfg.algo.epsilon_low, cfg.algo.epsilon_high
                    )
                    if ref_logps is not None:
                        kl = kl_penalty(logps, ref_logps[micro], cfg.algo.kl_estimator)
                        per_token = per_token + cfg.algo.beta * kl
                        totals["kl"] += (kl.detach() * mask).sum().item()
                    loss = aggregate_loss(per_token, mask, norm)
                    loss.backward()
                    step_loss += loss.item()
                    totals["clip_low"] += (low * mask).sum().item()
                    totals["clip_high"] += (high * mask).sum().item()
                    totals["tokens"] += mask.sum().item()
                grad_norm = torch.nn.utils.clip_grad_norm_(
                    self.model.parameters(),
                    cfg.optim.max_grad_norm if cfg.optim.max_grad_norm > 0 else float("inf"),
                )
                if torch.isfinite(grad_norm) and math.isfinite(step_loss):
                    self._weights_moved = True
                    self.optimizer.step()
                else:  # a non-finite step would poison the weights: skip it and count it
                    skipped += 1
                self.scheduler.step()
                self.optimizer.zero_grad(set_to_none=True)
                totals["loss"] += step_loss
                totals["grad_norm"] += grad_norm.item()
                updates += 1
        tokens = max(totals["tokens"], 1.0)
        return {
            "loss": totals["loss"] / updates,
            "kl": totals["kl"] / tokens if ref_logps is not None else None,
            "clip_frac": (totals["clip_low"] + totals["clip_high"]) / tokens,
            "clip_frac/low": totals["clip_low"] / tokens,
            "clip_frac/high": totals["clip_high"] / tokens,
            "grad_norm": totals["grad_norm"] / updates,
            "skipped_updates": skipped,
        }

    # ---- the loop ----------------------------------------------------------------------
    def step(self) -> dict[str, Any]:
        cfg, g = self.cfg, self.cfg.rollout.num_generations
        t0 = time.perf_counter()
        examples = self.sampler.next_batch(cfg.train.prompts_per_step)
        prompt_ids, prompt_mask = self._encode_prompts([ex["prompt"] for ex in examples])
        rollout = self.generator.generate(prompt_ids, prompt_mask, g)
        t_gen = time.perf_counter()

        rewards, per_function = self._score(examples, rollout, g)
        advantages, adv_stats = group_advantages(rewards, g, cfg.algo.scale_rewards)
        advantages = advantages.to(self.device)
        t_score = time.perf_counter()

        # Unscorable completions (fused reward NaN) leave the loss and its denominators.
        loss_mask = rollout.completion_mask.float() * (~torch.isnan(rewards)).float().to(self.device).unsqueeze(1)
        if cfg.algo.mask_truncated:  # DAPO overlong filtering: truncated answers teach nothing
            loss_mask = loss_mask * (~rollout.truncated).float().unsqueeze(1)
        lr = self.scheduler.get_last_lr()[0]
        update = self._update(rollout, advantages, loss_mask)
        t_train = time.perf_counter()

        self.step_index += 1
        lengths = rollout.lengths.float()
        reward_list = rewards.tolist()
        metrics: dict[str, Any] = {
            "step": self.step_index,
            "reward/mean": _nanmean(reward_list),
            "reward/std": _nanstd(reward_list),
            **{f"reward/{name}/mean": _nanmean(vals) for name, vals in per_function.items()},
            **{
                f"reward/{name}/nan_frac": sum(math.isnan(v) for v in vals) / len(vals)
                for name, vals in per_function.items()
            },
            **{f"weight_effect/{name}": share for name, share in self.last_fusion.weight_effect.items()},
            "reward/masked_functions": len(self.last_fusion.masked),
            **self.reward_diagnostics,
            **update,
            "completion_len/mean": lengths.mean().item(),
            "completion_len/max": lengths.max().item(),
            "frac_truncated": rollout.truncated.float().mean().item(),
            "frac_zero_std_groups": adv_stats.frac_zero_std_groups,
            "frac_unscorable": len(adv_stats.unscorable_indices) / len(reward_list),
            "lr": lr,
            "time/generate_s": t_gen - t0,
            "time/score_s": t_score - t_gen,
            "time/train_s": t_train - t_score,
            "time/step_s": t_train - t0,
        }
        metrics["_alerts"] = list(self.last_fusion.alerts)  # masking events: shown, not just logged
        metrics["_samples"] = [
            {
                "prompt": examples[i // g]["prompt"],
                "completion": rollout.texts[i],
                "rewards": {name: vals[i] for name, vals in per_function.items()},
                "reward": reward_list[i],
                "advantage": advantages[i].item(),
            }
            for i in range(min(len(reward_list), 2 * g))
        ]
        return metrics

    @torch.no_grad()
    def evaluate(self, limit: int = 64) -> dict[str, float]:
        """Greedy answers on the held-out split: one completion per prompt."""
        examples = self.eval_examples[:limit]
        prompt_ids, prompt_mask = self._encode_prompts([ex["prompt"] for ex in examples])
        rollout = self.generator.generate(prompt_ids, prompt_mask, 1, greedy=True)
        rewards, per_function = self._score(examples, rollout, 1, update_state=False)
        out = {"eval/reward/mean": _nanmean(rewards.tolist())}
        out.update({f"eval/reward/{name}/mean": _nanmean(v) for name, v in per_function.items()})
        return out

    def train(self) -> list[dict[str, Any]]:
        """Ctrl-C saves a resumable checkpoint of the last finished step, then re-raises."""
        cfg = self.cfg
        try:
            while self.step_index < cfg.train.steps:
                self._step_start, self._weights_moved = self._capture_state(), False
                metrics = self.step()
                self._step_start = None  # the step finished: the live state is consistent again
                if cfg.train.eval_every and self.step_index % cfg.train.eval_every == 0 and self.eval_examples:
                    metrics.update(self.evaluate())
                self.history.append({k: v for k, v in metrics.items() if not k.startswith("_")})
                for callback in self.callbacks:
                    callback(metrics)
                if cfg.train.save_every and self.step_index % cfg.train.save_every == 0:
                    self.save()
        except KeyboardInterrupt:
            if self._step_start is None or not self._weights_moved:
                if self._step_start is not None:  # roll back to the start of the unfinished step
                    self._apply_state(self._step_start)
                self.optimizer.zero_grad(set_to_none=True)
                self.save()
            raise
        return self.history

    # ---- checkpoints -------------------------------------------------------------------
    def _capture_state(self) -> dict[str, Any]:
        """What a resume needs beyond weights and optimizer: RNG, data position, reward stats."""
        return {
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "python_rng": random.getstate(),
            "sampler": self.sampler.state_dict(),
            "fusion": copy.deepcopy(self.reward_fusion.state_dict()),
        }

    def _apply_state(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(state["torch_rng"])
        if state.get("cuda_rng") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        random.setstate(state["python_rng"])
        self.sampler.load_state_dict(state["sampler"])
        self.reward_fusion.load_state_dict(state["fusion"])

    def save(self) -> Path:
        state = self._capture_state()
        trainer_state = {
            "step": self.step_index,
            "sampler": state.pop("sampler"),
            "fusion": state.pop("fusion"),
            "config": asdict(self.cfg),
        }
        training_state = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(), **state}
        directory = self.run_dir / "checkpoints" / f"step_{self.step_index:06d}"
        return save_checkpoint(directory, self.model, self.tokenizer, trainer_state, training_state)

    def _restore(self, directory: Path) -> None:
        """Continue exactly where the checkpoint left off: same data order, same RNG."""
        trainer_state, training_state = load_checkpoint_state(directory)
        self.optimizer.load_state_dict(training_state["optimizer"])
        self.scheduler.load_state_dict(training_state["scheduler"])
        self._apply_state({**training_state, "sampler": trainer_state["sampler"], "fusion": trainer_state["fusion"]})
        self.step_index = trainer_state["step"]
        self.history = truncate_metrics(self.run_dir / "metrics.jsonl", self.step_index)

    def cleanup(self) -> None:
        """Free the models so the next job of a multirun starts from an empty process."""
        if hasattr(self, "reward_executor"):
            self.reward_executor.close()  # worker processes end with the job, not the interpreter
        models = ("model", "reference", "generator", "optimizer", "scheduler")
        for name in (*models, "reward_executor", "reward_fusion", "reward_sources"):  # a reward model too
            if hasattr(self, name):
                delattr(self, name)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def truncate_metrics(path: Path, last_step: int) -> list[dict[str, Any]]:
    """Drop metric lines past a resumed checkpoint (those steps run again); return the rest."""
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    kept = [row for row in rows if row.get("step", 0) <= last_step]
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in kept))
    os.replace(tmp, path)
    return kept
