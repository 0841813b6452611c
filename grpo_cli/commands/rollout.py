"""`grpo rollout`: G completions per prompt of a data set, streamed to the jsonl `grpo score` reads."""

from __future__ import annotations

import hashlib
import json
import logging
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import transformers
from rich.markup import escape

from grpo_cli import __version__
from grpo_cli.commands.errors import EXIT_INTERRUPTED
from grpo_cli.config.rollout_checks import validate_rollout
from grpo_cli.config.schema import PrecisionConfig, RolloutRunConfig
from grpo_cli.data import load_examples
from grpo_cli.environments import environment_columns
from grpo_cli.errors import GrpoError
from grpo_cli.model_source import hub_id
from grpo_cli.models import pick_device, set_cpu_threads
from grpo_cli.monitor.progress import PromptProgress
from grpo_cli.monitor.terminal import stderr_console
from grpo_cli.rollout import Rollout
from grpo_cli.rollout.stream import RolloutsFile, indexed_examples, meta_path, stream_rollouts, write_meta
from grpo_cli.training.pipeline import generate_groups, load_sampling_model, select_split

log = logging.getLogger("grpo")
transformers.utils.logging.disable_progress_bar()  # the prompt bar is the one progress display


def _absolute(path: str | None) -> str | None:
    """A resume from another directory must compare the same file under the same name."""
    return None if path is None else str(Path(path).resolve())


REACHING_THE_SERVER = ("mode", "server_url", "call_timeout", "ready_timeout", "transfer")  # rollout.vllm.*


def rollout_settings(cfg: RolloutRunConfig, dtype: str, examples: list[dict[str, Any]]) -> dict[str, Any]:
    """Everything that decides what the file holds: a resume must match it key for key.

    Not here: output, max_prompts (a resume may extend the file), device, console, resume. The
    split's rows are hashed, so an edited data file is noticed as well as a changed data key.
    """
    path = cfg.model.path  # a hub id names the same model from any directory; a local path is made absolute
    model = {"kind": cfg.model.kind, "path": path if path and hub_id(path) else _absolute(path), "dtype": dtype}
    if cfg.model.kind == "tiny":
        model["tiny"] = asdict(cfg.model.tiny)
    # not the file's content: resume, train's max_staleness (0 here), and how a vLLM server is reached
    sampling = {key: value for key, value in asdict(cfg.rollout).items() if key not in ("resume", "max_staleness")}
    if cfg.rollout.backend != "vllm":  # the engine's settings decide nothing else (and older files lack them)
        del sampling["vllm"]
    else:  # older files lack these, and a server reached otherwise samples the same
        for key in REACHING_THE_SERVER:
            del sampling["vllm"][key]
    rows = hashlib.sha256(json.dumps(examples, sort_keys=True).encode()).hexdigest()
    return {
        "model": model,
        "data": {**asdict(cfg.data), "path": _absolute(cfg.data.path), "sha256": rows},
        "split": cfg.split,
        "seed": cfg.seed,
        "batch_size": cfg.batch_size,  # the batches fix which prompts share a seeded generate call
        "rollout": sampling,
    }


def select_examples(cfg: RolloutRunConfig) -> list[dict[str, Any]]:
    """The split's rows, each with its data set position; `train`/`eval` are exactly the trainer's."""
    return select_split(indexed_examples(load_examples(cfg.data)), cfg.split, cfg.data)


def resume_command(output: Path) -> str:
    """The command line that continues this file: the same overrides, the output named, resume on."""
    kept = [a for a in sys.argv[1:] if not a.startswith(("output=", "rollout.resume=", "-m", "--multirun"))]
    return shlex.join(["grpo", "rollout", *kept, f"output={output}", "rollout.resume=true"])


def prepare(
    cfg: RolloutRunConfig, run_dir: Path, dtype: str, examples: list[dict[str, Any]]
) -> tuple[Callable[[list[dict[str, Any]]], Rollout], list[dict[str, Any]], dict[str, Any]]:
    """Load the model, fit the prompts to its context: (generate, the prompts to write, what the
    meta file records of this)."""
    device = pick_device(cfg.device)
    set_cpu_threads(cfg.threads, cfg.model.kind, device)
    loaded = load_sampling_model(
        cfg.model, cfg.data, cfg.rollout, cfg.split, examples, cfg.max_prompts, run_dir, cfg.seed, device, dtype,
        cfg.env, cfg.sandbox,
    )  # fmt: skip
    examples, model_dir, budget = loaded.examples, loaded.model_dir, loaded.budget
    generate = partial(
        generate_groups, encoder=loaded.encoder, generator=loaded.generator, group_size=cfg.rollout.num_generations
    )
    facts = {
        "model_dir": str(Path(model_dir).resolve()),
        "device": str(device),
        "max_prompts": cfg.max_prompts,
        "prompts": len(examples),
        "rollout_loop": loaded.loop,
        **budget.summary(),
    }
    return generate, examples, facts


def run_rollout(cfg: RolloutRunConfig, run_dir: Path) -> float:
    """Returns the mean completion length in tokens over the whole file (EOS included): the same
    for the same seed on any machine, unlike tokens/s, so a sweep over sampling settings or
    checkpoints can compare how long the answers are."""
    validate_rollout(cfg)
    run_dir = Path(run_dir)
    output = Path(cfg.output) if cfg.output else run_dir / "rollouts.jsonl"
    dtype = PrecisionConfig().dtype if cfg.model.dtype == "auto" else cfg.model.dtype  # no precision section here
    start = time.perf_counter()
    examples = select_examples(cfg)
    environment_columns(cfg.env, cfg.sandbox, examples)  # data the environment cannot use: refused before the model
    settings = rollout_settings(cfg, dtype, examples)
    console = stderr_console()
    try:  # as score and eval do: output= may name a directory still to make
        output.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise GrpoError(f"output={cfg.output}: cannot create its directory {output.parent} ({err.strerror})") from None
    with RolloutsFile(output, settings, cfg.rollout.resume) as out:  # a refused output fails before the model loads
        if out.cut_bytes:
            log.warning("%s: dropped a half-written last line (%d bytes): generated again", output, out.cut_bytes)
        generate, examples, facts = prepare(cfg, run_dir, dtype, examples)
        meta = {"grpo_version": __version__, "settings": settings, **facts, "complete": False}
        write_meta(meta_path(output), meta)
        already = sum(row["index"] in out.done for row in examples)
        if out.resumed:
            log.info("resuming %s: %d of %d prompts already there", output, already, len(examples))
        try:
            with PromptProgress("rollout", len(examples), cfg.console, console, done=already) as progress:
                stream_rollouts(examples, generate, out, cfg.batch_size, cfg.seed, progress.advance)
        except KeyboardInterrupt:
            console.print(
                f"[bold yellow]interrupted[/] with {len(out.done)} prompts in {escape(str(output))}. "
                f"Continue with:\n  {escape(resume_command(output))}",
                highlight=False,
                soft_wrap=True,
            )
            sys.exit(EXIT_INTERRUPTED)
        write_meta(meta_path(output), {**meta, "complete": True, "prompts_in_file": len(out.done)})
    mean_length = out.tokens / out.completions
    console.print(
        f"wrote {output}: {len(examples) - already} new prompts x {cfg.rollout.num_generations} completions "
        f"({len(out.done)} prompts in the file), mean length {mean_length:.1f} tokens, "
        f"{progress.tokens_per_s:.0f} tok/s, {time.perf_counter() - start:.1f}s",
        highlight=False,
        soft_wrap=True,
    )
    return mean_length
