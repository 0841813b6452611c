"""One `grpo train` step against one step of TRL's GRPOTrainer, on identical CPU work.

    pip install 'grpo-cli[bench]'          # TRL (trl>=1.16,<2) and its datasets/pandas/pyarrow
    python benchmarks/vs_trl.py            # both workloads, 3 seeds, 20 steps each, 1 thread
    python benchmarks/vs_trl.py --workloads small --seeds 5 --steps 30 --json vs_trl.json
    python benchmarks/vs_trl.py --identical-work   # every completion exactly max new tokens, in both

Workloads (8 prompts x 8 completions per step, one optimizer step per rollout batch):

    tiny   the built-in default model (ModelConfig() / `model=tiny`: Llama, hidden 64, 2 layers,
           4 heads, MLP 128, tied embeddings, byte-level tokenizer), 4 new tokens, lr 3e-3
    small  the same family at hidden 256, 4 layers, 4 heads (head dim 64), MLP 688: 3,230,720
           parameters, same tokenizer, 16 new tokens, lr 1e-3

Both frameworks load the same random-init weights and tokenizer from one directory (grpo:
ModelConfig(kind="hf", path=DIR), TRL: GRPOTrainer(model=DIR)) and share every setting that
changes the work or the maths: beta 0.04 (so both run a frozen reference model), k3 KL,
temperature 1.0, top_p 1, top_k 0, clip epsilon 0.2/0.2, token-level ratios, loss_type "grpo"
(mean over sequences of each sequence's token mean), scale_rewards "group" (std + 1e-4), AdamW
(torch's fused kernel in both) betas (0.9, 0.99), eps 1e-8, weight decay 0, constant lr with no warm-up,
max_grad_norm 1.0, fp32 weights and maths, no gradient checkpointing, the same number of torch
threads, the arithmetic prompts in grpo's own order for the seed (TRL: unshuffled dataset of that
order), and grpo's own reward functions (grpo_cli.rewards.answers.exact_match and
answer_partial_credit; TRL gets them as plain functions with reward_weights 0.5/0.5, which is
grpo's weighted_mean fusion).

Each (workload, seed, framework) runs in a fresh subprocess, alternating grpo, trl, grpo, trl...;
nothing is read from or written to the network (HF_HUB_OFFLINE=1) and every file goes under one
temporary directory, removed at the end.

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
                    over seeds; the fused reward is (exact_match + partial_credit) / 2 in both
    compl. len      mean completion length in tokens (EOS included)
    needed GFLOP    median FLOPs a step needs, by the formula below
    % fp32 peak     needed FLOPs / step time / the measured fp32 matmul peak, median over steps

Needed FLOPs of a step (P parameters, tied embedding counted once; attention scores ignored):

    T      = sum over groups of the prompt's tokens (once per group: G completions share it)
             + sum of every completion's actual tokens
    needed = 3 forward passes x 2·P·T   (generation prefill+decode, reference pass, policy pass)
           + 1 backward pass  x 4·P·T   (twice the policy forward)
           = 10·P·T

The fp32 matmul peak is the best GFLOP/s of a few torch.mm of 1024-2048 square fp32 matrices in
this process, at the thread count the runs use (and, in the JSON, at all cores). A busy machine
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

from grpo_cli.config.schema import TinyModelConfig

TRL_MISSING = "TRL is not installed: pip install 'grpo-cli[bench]' (trl>=1.16,<2)"
FRAMEWORKS = ("grpo", "trl")
REWARD_WINDOW = 10  # first-10 and last-10 mean reward


@dataclass(frozen=True)
class Workload:
    name: str
    size: TinyModelConfig  # the Llama build_tiny_model writes
    max_new_tokens: int
    lr: float
    prompts_per_step: int = 8
    num_generations: int = 8


WORKLOADS = {
    "tiny": Workload("tiny", TinyModelConfig(), max_new_tokens=4, lr=3e-3),  # TinyModelConfig() defaults
    "small": Workload("small", TinyModelConfig(256, 4, 4, 688), max_new_tokens=16, lr=1e-3),  # 3,230,720 parameters
}


@dataclass(frozen=True)
class Shared:
    """The settings both frameworks get (module docstring)."""

    beta: float = 0.04
    temperature: float = 1.0
    epsilon: float = 0.2
    loss_type: str = "grpo"
    scale_rewards: str = "group"
    adam_betas: tuple[float, float] = (0.9, 0.99)
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


@dataclass
class StepRecord:
    step_s: float
    generate_s: float
    reward: float
    prompt_tokens: int  # each group's prompt once
    completion_tokens: int  # actual tokens, EOS included
    completions: int


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


def prompt_schedule(seed: int, steps: int, prompts_per_step: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(grpo's training split, the prompts its sampler hands out for `steps` steps, in order)."""
    from grpo_cli.config.schema import DataConfig
    from grpo_cli.data import PromptSampler, load_examples, split_examples

    data = DataConfig()
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
    from grpo_cli.config.schema import ModelConfig, TrainConfig

    w, cfg = spec.workload, TrainConfig()
    cfg.model = ModelConfig(kind="hf", path=spec.model_dir)
    cfg.train.steps, cfg.train.seed, cfg.train.threads = spec.steps, spec.seed, spec.threads
    cfg.train.prompts_per_step, cfg.train.device = w.prompts_per_step, "cpu"
    cfg.rollout.num_generations, cfg.rollout.max_new_tokens = w.num_generations, w.max_new_tokens
    cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.top_k = SHARED.temperature, 1.0, 0
    if spec.identical_work:
        cfg.rollout.min_new_tokens = w.max_new_tokens  # no EOS before max_new_tokens: every length forced
    cfg.algo.beta, cfg.algo.loss_type, cfg.algo.scale_rewards = SHARED.beta, SHARED.loss_type, SHARED.scale_rewards
    cfg.algo.epsilon_low = cfg.algo.epsilon_high = SHARED.epsilon
    cfg.optim.lr, cfg.optim.betas, cfg.optim.weight_decay = w.lr, list(SHARED.adam_betas), SHARED.weight_decay
    cfg.optim.max_grad_norm, cfg.optim.scheduler, cfg.optim.warmup_steps = SHARED.max_grad_norm, "constant", 0
    cfg.monitor.plots = False
    return cfg


def run_grpo(spec: RunSpec) -> RunResult:
    start = time.perf_counter()
    from grpo_cli.training.trainer import GRPOTrainer

    w = spec.workload
    train, schedule = prompt_schedule(spec.seed, spec.steps, w.prompts_per_step)
    trainer = GRPOTrainer(grpo_config(spec), Path(spec.run_dir), observers=[])
    trainer.setup()
    assert trainer.train_examples == train, "grpo's training split differs from the benchmark's copy of it"
    setup_s = time.perf_counter() - start
    records, loops = [], set()
    for index in range(spec.steps):
        t0 = time.perf_counter()
        result = trainer.step()  # generate, score, advantages, update: what the loop calls per step
        step_s = time.perf_counter() - t0
        m = result.metrics
        n = w.prompts_per_step * w.num_generations
        batch = schedule[index * w.prompts_per_step : (index + 1) * w.prompts_per_step]
        check_forced_lengths(spec, m["completion_len/mean"])
        if "rollout_loop" in m:  # e.g. "fast", "generate (rollout.loop=generate)"
            loops.add(str(m["rollout_loop"]).split(" ")[0])
        records.append(
            StepRecord(
                step_s=step_s,
                generate_s=m["time/generate_s"],
                reward=m["reward/mean"],
                prompt_tokens=sum(trainer.encoder.token_counts([ex["prompt"] for ex in batch])),
                completion_tokens=round(m["completion_len/mean"] * n),
                completions=n,
            )
        )
    notes = {"rollout_loop": sorted(loops), "torch_threads": _torch_threads()}
    return RunResult("grpo", w.name, spec.seed, records, peak_rss_mib(), setup_s, spec.threads, notes)


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


# ---- the TRL child ------------------------------------------------------------------------


def trl_config(spec: RunSpec) -> Any:
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
        loss_type=SHARED.loss_type,
        scale_rewards=SHARED.scale_rewards,
        reward_weights=[0.5, 0.5],  # grpo's weighted_mean of its two functions
        learning_rate=w.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim="adamw_torch_fused",  # torch's fused AdamW kernel, as grpo's build_optimizer uses
        adam_beta1=SHARED.adam_betas[0],
        adam_beta2=SHARED.adam_betas[1],
        adam_epsilon=SHARED.adam_eps,
        weight_decay=SHARED.weight_decay,
        max_grad_norm=SHARED.max_grad_norm,
        bf16=False,  # TRL's default is bf16 autocast; grpo computes in fp32
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
    return GRPOConfig(**kwargs)


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
        """TRL's trainer, recording each generation batch: time, prompts, token counts, reward."""

        bench_generate_s: list[float]
        bench_batches: list[dict[str, Any]]

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

    return StepClock, RecordingGRPOTrainer


def run_trl(spec: RunSpec) -> RunResult:
    start = time.perf_counter()
    import torch

    torch.set_num_threads(spec.threads)
    from datasets import Dataset

    from grpo_cli.rewards.answers import answer_partial_credit, exact_match

    w = spec.workload
    _, schedule = prompt_schedule(spec.seed, spec.steps, w.prompts_per_step)
    step_clock, trainer_class = trl_classes()
    clock = step_clock()
    trainer = trainer_class(
        model=spec.model_dir,
        reward_funcs=[exact_match, answer_partial_credit],
        args=trl_config(spec),
        train_dataset=Dataset.from_list(schedule),
        callbacks=[clock],
    )
    trainer.bench_generate_s, trainer.bench_batches = [], []
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
        records.append(StepRecord(seconds, gen_s, batch["reward"], batch["prompt_tokens"], sum(lengths), len(lengths)))
    notes = {"torch_threads": torch.get_num_threads(), "model_dtype": str(trainer.model.dtype)}
    return RunResult("trl", w.name, spec.seed, records, peak_rss_mib(), setup_s, spec.threads, notes)


def child_main(spec_path: Path) -> None:
    raw = json.loads(spec_path.read_text())
    raw["workload"] = Workload(**{**raw["workload"], "size": TinyModelConfig(**raw["workload"]["size"])})
    spec = RunSpec(**raw)
    import transformers

    transformers.utils.logging.disable_progress_bar()
    result = run_grpo(spec) if spec.framework == "grpo" else run_trl(spec)
    Path(spec.out).write_text(json.dumps(asdict(result)))


# ---- the parent ---------------------------------------------------------------------------


def build_model(directory: Path, workload: Workload) -> int:
    """The random-init model and tokenizer both frameworks load; returns its parameter count."""
    import torch
    from transformers import AutoModelForCausalLM

    from grpo_cli.models import build_tiny_model

    build_tiny_model(directory, workload.size, seed=SHARED.model_seed)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    return sum(p.numel() for p in model.parameters())  # a tied embedding once


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
                f"{s['completions_per_s']:.0f}",
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


def versions() -> dict[str, str]:
    return {name: importlib.metadata.version(name) for name in ("grpo-cli", "trl", "transformers", "torch")}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="tiny,small", help="comma-separated: " + ", ".join(WORKLOADS))
    parser.add_argument("--seeds", type=int, default=3, help="runs per framework and workload (seeds 0..N-1)")
    parser.add_argument("--steps", type=int, default=20, help="steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="first steps of each run left out of the timings")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in both (1: robust on a busy 2-core box)")
    parser.add_argument("--identical-work", action="store_true", help="force every completion to max new tokens")
    parser.add_argument("--json", type=Path, help="write every raw figure here")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = set(args.workloads.split(",")) - set(WORKLOADS)
    if unknown:
        parser.error(f"unknown workloads {sorted(unknown)}; choose from {', '.join(WORKLOADS)}")
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
    started, load_before = time.perf_counter(), os.getloadavg()
    import transformers

    transformers.utils.logging.disable_progress_bar()
    peak = matmul_peak_gflops(args.threads)
    raw: dict[str, Any] = {"runs": [], "workloads": {}, "summary": {}}
    with tempfile.TemporaryDirectory(prefix="vs_trl_") as tmp_name:
        tmp = Path(tmp_name)
        for name in args.workloads.split(","):
            workload = WORKLOADS[name]
            params = build_model(tmp / name / "model", workload)
            raw["workloads"][name] = {**asdict(workload), "params": params}
            runs: dict[str, list[RunResult]] = {fw: [] for fw in FRAMEWORKS}
            for seed in range(args.seeds):
                for framework in FRAMEWORKS:  # alternating, so a change in load hits both
                    run_dir = tmp / name / f"{framework}_seed{seed}"
                    run_dir.mkdir(parents=True)
                    spec = RunSpec(
                        framework,
                        workload,
                        seed,
                        args.steps,
                        args.threads,
                        args.identical_work,
                        str(tmp / name / "model"),
                        str(run_dir),
                        str(run_dir / "result.json"),
                    )
                    result = run_child(spec, tmp)
                    runs[framework].append(result)
                    raw["runs"].append(asdict(result))
                    done = statistics.median(s.step_s for s in result.steps[args.warmup :])
                    print(f"  {name} {framework} seed {seed}: median step {done:.3f} s", file=sys.stderr)
            raw["summary"][name] = {fw: summarize(runs[fw], params, args.warmup, peak) for fw in FRAMEWORKS}
    wall = time.perf_counter() - started
    raw.update(
        command=" ".join([Path(sys.executable).name, *sys.argv]),
        wall_s=wall,
        settings={**vars(args), "json": str(args.json) if args.json else None, "child": None},
        shared=asdict(SHARED),
        versions=versions(),
        matmul_peak_gflops={
            "threads": args.threads,
            "at_threads": peak,
            "all_cores": matmul_peak_gflops(os.cpu_count() or 1),
        },
        load_average={"before": load_before, "after": os.getloadavg()},
        cpus=os.cpu_count(),
    )
    print_report(raw)
    if args.json:
        args.json.write_text(json.dumps(raw, indent=1))


def framework_names(raw: dict[str, Any]) -> dict[str, str]:
    """Table labels; grpo's names the sampling loop it ran (metrics `rollout_loop`, where grpo logs it)."""
    loops = sorted({loop for run in raw["runs"] if run["framework"] == "grpo" for loop in run["notes"]["rollout_loop"]})
    return {"grpo": f"grpo ({'/'.join(loops)} loop)" if loops else "grpo", "trl": f"TRL {raw['versions']['trl']}"}


def print_report(raw: dict[str, Any]) -> None:
    v, peak, load = raw["versions"], raw["matmul_peak_gflops"], raw["load_average"]
    settings = raw["settings"]
    print(
        f"grpo {v['grpo-cli']} vs TRL {v['trl']} (transformers {v['transformers']}, torch {v['torch']}); "
        f"{settings['seeds']} seeds x {settings['steps']} steps, first {settings['warmup']} of each left out of the "
        f"timings; {settings['threads']} torch thread(s) each; "
        + ("every completion forced to max new tokens" if settings["identical_work"] else "free-running lengths")
    )
    for name, info in raw["workloads"].items():
        size = info["size"]
        print(
            f"  {name}: {info['params']:,} parameters (hidden {size['hidden_size']}, {size['num_layers']} layers, "
            f"{size['num_heads']} heads, MLP {size['intermediate_size']}); {info['prompts_per_step']} prompts x "
            f"{info['num_generations']} completions, {info['max_new_tokens']} new tokens, lr {info['lr']:g}"
        )
    print(
        f"fp32 matmul peak: {peak['at_threads']:.1f} GFLOP/s at {peak['threads']} thread(s) "
        f"({peak['all_cores']:.1f} at all {raw['cpus']} cores); load average before {load['before'][0]:.2f}, "
        f"after {load['after'][0]:.2f}"
    )
    print("needed FLOPs/step = 3 forwards x 2·P·T + 1 backward x 4·P·T = 10·P·T, T = prompt tokens once per group")
    print("  + actual completion tokens; % fp32 peak = needed FLOPs / step time / matmul peak")
    print()
    print(markdown_table(raw["summary"], framework_names(raw)))
    print()
    print(f"benchmark wall time {raw['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
