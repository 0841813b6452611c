"""`grpo eval`: sample G completions per held-out prompt (or read a rollouts file), score them with
the configured rewards, and write eval.json: accuracy, unbiased pass@k, mean rewards, lengths.

The stages are the trainer's own (`training/pipeline.py` generates and scores, `scoring` reads a
rollouts file), so a checkpoint's greedy figures here equal what `train.eval_every` logged.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import torch
import transformers
from rich.markup import escape
from rich.table import Table

from grpo_cli.config.eval_checks import validate_eval
from grpo_cli.config.schema import EvalConfig
from grpo_cli.core.precision import effective_precision, weights_dtype
from grpo_cli.data import load_examples
from grpo_cli.environments import environment_columns
from grpo_cli.errors import GrpoError
from grpo_cli.evaluation import ScoredSamples, SuccessRule, sample_metrics
from grpo_cli.models import load_tokenizer, pick_device, set_cpu_threads
from grpo_cli.monitor import write_summary
from grpo_cli.monitor.progress import PromptProgress
from grpo_cli.monitor.terminal import stderr_console
from grpo_cli.rewards import RewardExecutor, RewardFusion, check_columns, resolve_reward_sources, reward_diagnostics
from grpo_cli.rewards.batch import COMPLETION_LENGTHS
from grpo_cli.scoring import scored_batches
from grpo_cli.training.pipeline import evaluate_greedy, generate_and_score, load_sampling_model, select_split
from grpo_cli.training.state import seed_everything

log = logging.getLogger("grpo")
transformers.utils.logging.disable_progress_bar()
FINISH_TRUNCATED = {"length": True, "stop": False}  # the rollouts contract's finish_reason (docs/architecture.md §6)


def _generated(
    cfg: EvalConfig, run_dir: Path, fusion: RewardFusion, executor: RewardExecutor, rule: SuccessRule
) -> tuple[ScoredSamples, dict[str, float], dict[str, Any]]:
    """Sampled groups (and greedy answers) on the split, as the trainer splits and fits its prompts."""
    device = pick_device(cfg.device)
    set_cpu_threads(cfg.threads, cfg.model.kind, device)
    precision, notice = effective_precision(cfg.precision, device)
    if notice:
        log.warning(notice)
    examples = select_split(load_examples(cfg.data), cfg.split, cfg.data)
    data_columns = list({k for ex in examples for k in ex if k != "prompt"})
    check_columns(fusion.sources, data_columns + environment_columns(cfg.env, cfg.sandbox, examples))
    loaded = load_sampling_model(
        cfg.model,
        cfg.data,
        cfg.rollout,
        cfg.split,
        examples,
        cfg.max_prompts,
        run_dir,
        cfg.seed,
        device,
        weights_dtype(precision),
        cfg.env,
        cfg.sandbox,
    )
    examples, encoder, generator, model_dir = loaded.examples, loaded.encoder, loaded.generator, loaded.model_dir
    group_size, console = cfg.rollout.num_generations, stderr_console()
    with PromptProgress("eval: sampled", len(examples), "auto", console) as progress:
        samples = generate_and_score(
            examples, encoder, generator, executor, fusion, group_size, cfg.batch_size, on_batch=progress.advance
        )
    greedy, answers = {}, []
    if cfg.greedy:
        with PromptProgress("eval: greedy", len(examples), "auto", console) as progress:
            scoring = (executor, fusion, rule, cfg.batch_size)
            greedy = evaluate_greedy(examples, encoder, generator, *scoring, on_batch=progress.advance, answers=answers)
    loop = loaded.loop
    del loaded, generator  # a multirun's next job starts from free memory
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    origin = {"model": str(model_dir), "split": cfg.split, "rollout_loop": loop}
    return samples, greedy, {**origin, "greedy_answers": answers} if cfg.greedy else origin


def _from_file(
    cfg: EvalConfig, fusion: RewardFusion, executor: RewardExecutor
) -> tuple[ScoredSamples, dict[str, float], dict[str, Any]]:
    """A rollouts file, rescored with the configured rewards (rewards a scored file carries are
    ignored: the figures always mean this config's functions)."""
    count_tokens = None
    if cfg.tokenizer:
        tokenizer = load_tokenizer(cfg.tokenizer)

        def count_tokens(text: str) -> int:
            return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    if cfg.greedy:
        log.info("greedy: not measured on a rollouts file (it needs the model); set greedy=false to silence this")
    samples: ScoredSamples | None = None
    for rows, batch, result in scored_batches(
        Path(cfg.input), fusion, executor, cfg.batch_size, count_tokens, False, False, cfg.max_prompts
    ):
        samples = samples or ScoredSamples(batch.group_size)
        truncated = [FINISH_TRUNCATED.get(c.get("finish_reason")) for row in rows for c in row["completions"]]
        samples.add(result.fused, result.per_function, batch.columns[COMPLETION_LENGTHS], truncated)
    if samples is None:
        raise GrpoError(f"input={cfg.input}: no prompts in the file")
    return samples, {}, {"input": str(cfg.input)}


def eval_table(report: dict[str, Any], names: list[str]) -> Table:
    """Sampled and greedy figures side by side (pass@k only has a sampled column)."""
    title = f"grpo eval: {report['prompts']} prompts x {report['num_generations']} completions"
    table = Table(title=title, caption=f"success: {report['success_function']} >= {report['success_threshold']}")
    for column in ("metric", "sampled", "greedy"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    for name in names:
        table.add_row(name, _fmt(report.get(name)), _fmt(report.get(f"greedy/{name}")))
    return table


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.4f}"
    return "-" if value is None else str(value)


def load_eval(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """An eval.json, or a directory holding one (a `grpo eval` run directory)."""
    path = Path(path)
    file = path / "eval.json" if path.is_dir() else path
    if not file.is_file():
        raise GrpoError(f"compare={path}: no eval.json there (give a grpo eval run directory or an eval.json)")
    try:
        report = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise GrpoError(f"compare={file}: not JSON: {err.msg} (line {err.lineno})") from None
    if not isinstance(report, dict):
        raise GrpoError(f"compare={file}: not an eval.json (expected a JSON object of figures)")
    return file, report


def compare_table(report: dict[str, Any], other: dict[str, Any]) -> Table:
    """Every figure either file has, this run's next to the other's, and this minus that."""
    table = Table(title="grpo eval: this run vs the other")
    for column in ("metric", "this", "other", "difference"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    names = [k for k in dict.fromkeys([*report, *other]) if _is_figure(report.get(k)) or _is_figure(other.get(k))]
    for name in names:
        mine, theirs = report.get(name), other.get(name)
        difference = "-"
        if _is_figure(mine) and _is_figure(theirs) and math.isfinite(mine) and math.isfinite(theirs):
            counts = isinstance(mine, int) and isinstance(theirs, int)  # prompts, completions
            difference = f"{mine - theirs:+d}" if counts else f"{mine - theirs:+.4f}"
        table.add_row(name, _fmt(mine), _fmt(theirs), difference)
    return table


def _is_figure(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def run_eval(cfg: EvalConfig, run_dir: Path) -> float:
    """Returns accuracy, the mean pass@1 over prompts: the objective of a sweep over checkpoints
    (`grpo eval -m model.path=A,B`) or over sampling settings."""
    validate_eval(cfg)
    run_dir = Path(run_dir)
    start = time.perf_counter()
    seed_everything(cfg.seed)
    other = load_eval(cfg.compare) if cfg.compare else None  # a wrong path fails before any work
    sources = resolve_reward_sources(cfg.reward.functions, cfg.device, cfg.sandbox, cfg.data.chat)
    rule = SuccessRule.resolve([s.name for s in sources], cfg.eval)
    diagnostics = reward_diagnostics(sources)  # e.g. the sandbox backend
    fusion = RewardFusion.from_config(sources, cfg.reward)
    with RewardExecutor(cfg.reward.num_workers, cfg.reward.timeout_s) as executor:
        if cfg.input:
            samples, greedy, origin = _from_file(cfg, fusion, executor)
        else:
            samples, greedy, origin = _generated(cfg, run_dir, fusion, executor, rule)
    metrics = sample_metrics(samples, rule, cfg.eval.k)
    report = {
        **origin,
        "prompts": samples.prompts,
        "num_generations": samples.group_size,
        "completions": len(samples.fused),
        "success_function": rule.name,
        "success_threshold": rule.threshold,
        **metrics,
        **{f"greedy/{name}": value for name, value in greedy.items()},
        "wall_s": time.perf_counter() - start,
        **diagnostics,
    }
    if "greedy_answers" in report:  # what the model answered, after the figures: a long list read last
        report["greedy_answers"] = report.pop("greedy_answers")
    output = Path(cfg.output) if cfg.output else run_dir / "eval.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    write_summary(output, report)
    console = stderr_console()
    source = report.get("input") or f"split={cfg.split} of {report['model']}"
    console.print(eval_table(report, list(metrics)))
    console.print(f"evaluated {escape(source)}", highlight=False, soft_wrap=True)
    if other is not None:
        other_file, other_report = other
        console.print(compare_table(report, other_report))
        console.print(f"other: {escape(str(other_file))}", highlight=False, soft_wrap=True)
    console.print(f"wrote {escape(str(output))}", highlight=False, soft_wrap=True)
    return metrics["accuracy"]
