"""`grpo export`: a training checkpoint as a self-contained Hugging Face model directory.

Everything comes from the checkpoint itself (trainer_state.json holds the config and the base
model's path), never from a Hydra config. A LoRA checkpoint is merged into its base unless
`merge_lora=false`. The directory is built in a temporary sibling, verified by reloading it with
plain `transformers` and comparing logits with the checkpoint's model, and only then renamed into
place: a failed export leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
import yaml
from peft import PeftModel
from peft.tuners.tuners_utils import BaseTunerLayer
from rich.markup import escape
from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerBase

from grpo_cli.checkpoint import (
    base_model_dir,
    is_complete,
    latest_checkpoint,
    read_trainer_state,
    run_dir_of,
    write_errors_as_os_errors,
)
from grpo_cli.commands.errors import CANNOT_WRITE, EXIT_INTERRUPTED
from grpo_cli.config.schema import EXPORT_DTYPES, ExportConfig
from grpo_cli.errors import GrpoError
from grpo_cli.model_source import is_gguf, load_gguf
from grpo_cli.models import DTYPES, is_adapter_dir, load_weights
from grpo_cli.monitor.terminal import stderr_console
from grpo_cli.reload_check import TOLERANCE, VERIFY_PROMPTS, prompt_logits, verify

transformers.utils.logging.disable_progress_bar()
SKIPPED_METRICS = ("time/", "throughput/", "memory/")  # machine figures: noise in a model card


@dataclass(frozen=True)
class ExportOf:
    """What is exported where, for the verification's sentence and its error."""

    origin: Path  # the checkpoint or GGUF file
    output: Path
    against: str  # what the reloaded logits are compared with
    trust_remote_code: bool


def resolve_checkpoint(setting: str) -> Path:
    """A checkpoint directory as given, or a run directory's newest complete checkpoint."""
    path = Path(setting)
    if not path.is_dir():
        raise GrpoError(f"checkpoint={setting}: no such directory")
    if is_complete(path):
        return path
    if (path / "checkpoints").is_dir() or (path / "metrics.jsonl").is_file():
        newest = latest_checkpoint(path)
        if newest is None:
            raise GrpoError(f"checkpoint={setting}: a run directory without a complete checkpoint in checkpoints/")
        return newest
    raise GrpoError(
        f"checkpoint={setting}: neither a checkpoint (RUN/checkpoints/step_N with trainer_state.json and "
        "training_state.pt) nor a run directory holding checkpoints/"
    )


def final_metrics(checkpoint: Path, step: int) -> dict[str, Any]:
    """The run's summary.json when it describes this checkpoint, else the metrics.jsonl line of its step."""
    run_dir = run_dir_of(checkpoint)
    if run_dir is None:
        return {}
    summary = run_dir / "summary.json"
    if summary.is_file():
        figures = json.loads(summary.read_text())
        final = figures.get("final_checkpoint")
        if final and Path(final).resolve() == checkpoint.resolve():
            return figures
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        return {}
    lines = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    row = next((r for r in reversed(lines) if r.get("step") == step), {})
    return {k: v for k, v in row.items() if not k.startswith(SKIPPED_METRICS)}


def untie_adapted_output(model: PeftModel) -> bool:
    """Before a merge: an adapter on an output layer tied to the input embeddings (the tiny model's
    lm_head) changes only the output, but merging into the one shared matrix would change both.
    Give the output layer its own copy and record the untying in the config. True if it did."""
    base = model.get_base_model()
    output = base.get_output_embeddings()
    layer = output.get_base_layer() if isinstance(output, BaseTunerLayer) else None
    if layer is None or layer.weight is not base.get_input_embeddings().weight:
        return False
    layer.weight = torch.nn.Parameter(layer.weight.detach().clone(), requires_grad=False)
    base.config.tie_word_embeddings = False
    return True


@torch.no_grad()
def checked_export(
    tmp: Path, dtype_name: str, tokenizer: PreTrainedTokenizerBase, source: list[torch.Tensor], export: ExportOf
) -> tuple[float, str]:
    """(largest |logit difference|, the model card's sentence) of the directory written in `tmp`;
    an export past the dtype's tolerance fails here, before anything is renamed into place."""
    difference, tolerance = verify(tmp, DTYPES[dtype_name], tokenizer, source, export.trust_remote_code)
    verification = (
        f"Verified: reloaded with `transformers.AutoModelForCausalLM.from_pretrained`, the largest |logit "
        f"difference| from {export.against} over {len(VERIFY_PROMPTS)} prompts is {difference:.3g} "
        f"(tolerance {tolerance:.3g} for {dtype_name})."
    )
    stderr_console().print(verification.replace("`", ""), highlight=False, soft_wrap=True)
    if not difference <= tolerance:  # NaN fails too
        raise GrpoError(
            f"export of {export.origin} failed verification: max |logit difference| {difference:.3g} > "
            f"{tolerance:.3g} ({dtype_name}); nothing was written to {export.output}"
        )
    return difference, verification


@contextlib.contextmanager
def staging(output: Path) -> Iterator[Path]:
    """A temporary sibling of `output` to write into. If anything fails before the rename, it is
    removed, and so are the parent directories made for it: a failed export leaves nothing."""
    made = [folder for folder in (output.parent, *output.parent.parents) if not folder.exists()]  # deepest first
    tmp = None
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
        yield tmp
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        for folder in made:
            with contextlib.suppress(OSError):  # one that is not empty is someone else's now
                folder.rmdir()
        raise


@contextlib.contextmanager
def export_errors(output: Path) -> Iterator[None]:
    """A place that cannot be written (read-only, full, forbidden) and Ctrl-C end in one line; the
    staging directory is already gone, so the line can say nothing was written."""
    try:
        yield
    except OSError as err:
        if err.errno not in CANNOT_WRITE:
            raise
        where = err.filename or output
        raise GrpoError(
            f"output={output}: {where}: {err.strerror} ({errno.errorcode[err.errno]}); nothing was written"
        ) from err
    except KeyboardInterrupt:
        stderr_console().print(
            f"[bold yellow]interrupted[/]: nothing was written to {escape(str(output))}",
            highlight=False,
            soft_wrap=True,
        )
        sys.exit(EXIT_INTERRUPTED)


def put_in_place(tmp: Path, output: Path, card: str) -> None:
    """The model card last, then one rename: `output` never holds a half-written export."""
    (tmp / "README.md").write_text(card, encoding="utf-8")
    tmp.chmod(0o755)  # mkdtemp's 0700 is for the half-written state only
    if output.exists():
        output.rmdir()  # empty (checked before anything was written); a non-empty one was refused
    os.replace(tmp, output)
    stderr_console().print(f"wrote {output}", highlight=False, soft_wrap=True)


def describe(state: dict[str, Any], adapter: bool, merge: bool, untied: bool, base: Path | None) -> str:
    """What the directory holds, for the model card."""
    if not adapter:
        return "full weights"
    if not merge:
        return f"LoRA adapter only (merge_lora=false); its base model: `{base}`"
    lora = state["config"]["model"]["lora"]
    what = f"LoRA adapter (r={lora['r']}, alpha={lora['alpha']}) merged into its base `{base}`"
    if untied:
        what += " (its output layer untied from the input embeddings: the adapter changed only the output)"
    return what


def model_card(
    output: Path,
    checkpoint: Path,
    state: dict[str, Any],
    what: str,
    dtype: str,
    verification: str,
    metrics: dict[str, Any],
) -> str:
    rows = "\n".join(f"| {k} | {v:.6g} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in metrics.items())
    figures = f"| metric | value |\n|---|---|\n{rows}" if metrics else "No run directory found beside the checkpoint."
    config = yaml.safe_dump(state["config"], sort_keys=False)
    return (
        "---\nlibrary_name: transformers\ntags: [grpo, reinforcement-learning]\n---\n"
        f"# {output.name}\n\n"
        f"Exported by `grpo export` from `{checkpoint}` (step {state['step']}): {what}, dtype {dtype}.\n\n"
        f"{verification}\n\n"
        "```python\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n"
        f'model = AutoModelForCausalLM.from_pretrained("{output}")\n'
        f'tokenizer = AutoTokenizer.from_pretrained("{output}")\n```\n\n'
        f"## Final metrics\n\n{figures}\n\n"
        f"## Training config\n\nAs saved in the checkpoint's trainer_state.json.\n\n```yaml\n{config}```\n"
    )


def export_gguf(source: Path, output: Path, dtype_name: str) -> float:
    """A GGUF file (a llama.cpp quantisation) as a plain safetensors directory, dequantised once so
    that later runs read it in about a second instead of converting for most of a minute."""
    if not source.is_file():
        raise GrpoError(f"checkpoint={source}: no such file")
    dtype = torch.float32 if dtype_name == "auto" else DTYPES[dtype_name]
    dtype_name = next(name for name, d in DTYPES.items() if d == dtype)
    console = stderr_console()
    console.print(f"exporting {source} (GGUF, dequantised by transformers)", soft_wrap=True)
    model, tokenizer = load_gguf(source)
    source_logits = prompt_logits(model, tokenizer)
    model.to(dtype)
    with staging(output) as tmp, write_errors_as_os_errors(output):  # a full disk inside safetensors: one line
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        del model
        export = ExportOf(source, output, "the GGUF file's dequantised model", trust_remote_code=False)
        difference, verification = checked_export(tmp, dtype_name, tokenizer, source_logits, export)
        card = (
            f"---\nlibrary_name: transformers\n---\n# {output.name}\n\nConverted by `grpo export` from the GGUF "
            f"file `{source}` (dequantised by transformers' GGUF loader), dtype {dtype_name}.\n\n{verification}\n"
        )
        put_in_place(tmp, output, card)
    return difference


def run_export(cfg: ExportConfig, run_dir: Path | None = None) -> float:
    """Returns the verification's largest |logit difference| (0 is a perfect copy).

    `run_dir` is unused: export writes only the directory it is asked to.
    """
    if not cfg.checkpoint or not cfg.output:
        raise GrpoError("grpo export needs checkpoint=DIR (a checkpoint or a run directory) and output=DIR")
    if cfg.dtype not in EXPORT_DTYPES:
        raise GrpoError(f"invalid value dtype={cfg.dtype!r}: must be one of {', '.join(EXPORT_DTYPES)}")
    output = Path(cfg.output)
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise GrpoError(f"output={cfg.output} already exists: choose a new directory (or remove it)")
    with export_errors(output):
        if is_gguf(cfg.checkpoint):
            return export_gguf(Path(cfg.checkpoint), output, cfg.dtype)
        return export_checkpoint(resolve_checkpoint(cfg.checkpoint), output, cfg)


def export_checkpoint(checkpoint: Path, output: Path, cfg: ExportConfig) -> float:
    """A training checkpoint (full weights or a LoRA adapter) as a verified Hugging Face directory."""
    state = read_trainer_state(checkpoint)
    adapter = is_adapter_dir(checkpoint)
    base = base_model_dir(checkpoint, state) if adapter else None
    trust_remote_code = bool(state["config"]["model"]["trust_remote_code"])
    if cfg.dtype == "auto":  # as saved: a LoRA adapter's base decides
        saved = AutoConfig.from_pretrained(base or checkpoint, trust_remote_code=trust_remote_code).dtype
        dtype = saved if saved in TOLERANCE else torch.float32
    else:
        dtype = DTYPES[cfg.dtype]
    dtype_name = next(name for name, d in DTYPES.items() if d == dtype)
    console = stderr_console()
    console.print(f"exporting {checkpoint} ({'LoRA adapter' if adapter else 'full weights'})", soft_wrap=True)

    # The checkpoint's model in float32 (a lossless upcast) is the truth the export is checked against.
    tokenizer = AutoTokenizer.from_pretrained(checkpoint, trust_remote_code=trust_remote_code)
    model = load_weights(checkpoint, base or checkpoint, torch.float32, trust_remote_code, key="checkpoint").eval()
    source = prompt_logits(model, tokenizer)
    merge, untied = adapter and cfg.merge_lora, False
    if merge:
        untied = untie_adapted_output(model)
        model = model.merge_and_unload()
    elif adapter:  # the adapter alone: transformers finds its base through this path
        base = base.resolve()
        model.peft_config["default"].base_model_name_or_path = str(base)
    model.to(dtype)

    with staging(output) as tmp, write_errors_as_os_errors(output):  # a full disk inside safetensors: one line
        model.save_pretrained(tmp)
        if adapter and not merge:
            model.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        del model  # the reload is the only copy in memory
        export = ExportOf(checkpoint, output, "the checkpoint's model", trust_remote_code)
        difference, verification = checked_export(tmp, dtype_name, tokenizer, source, export)
        what = describe(state, adapter, merge, untied, base)
        card = model_card(
            output, checkpoint, state, what, dtype_name, verification, final_metrics(checkpoint, state["step"])
        )
        put_in_place(tmp, output, card)
    return difference
