"""`grpo check`: the equalities the model zoo's tests hold for every family (tests/zoo), run on one model.

A family the zoo does not list may still train correctly, or not: a cache the fast loop cannot drive,
a packed mask that misses a layer kind, projections LoRA's default does not find. Each check below
runs what training runs, on the model itself, and compares it with a plain forward pass:

- sampling: the loop `grpo train` would pick (`rollout.engine.make_generator`); the log-probs it
  samples with equal a fresh forward's on the sampled ids (`SAMPLER_TOLERANCE`).
- layout: packed = padded per-token log-probs (`LAYOUT_TOLERANCE`) where packed is offered, else
  the reason it is refused.
- lora: the modules the default `model.lora.target_modules` finds, and how many decoder layers get one.
- fsdp: the decoder blocks `distributed.strategy=fsdp` wraps one by one.
- export: the model saved and reloaded with plain transformers gives the same logits.

The result is one row of the support matrix (docs/models.md); an equality that fails makes
`ModelReport.failed` true, and `grpo check` exit 1.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from grpo_cli.config.schema import LoraConfig, ModelConfig, RolloutConfig
from grpo_cli.core.logprobs import packed_unsupported, rows_logprobs
from grpo_cli.errors import GrpoError
from grpo_cli.lora import add_lora
from grpo_cli.models import is_peft, load_policy
from grpo_cli.reload_check import prompt_logits, verify
from grpo_cli.rollout.base import Rollout, finish_rollout
from grpo_cli.rollout.engine import make_generator
from grpo_cli.rollout.fast import FastGenerator
from grpo_cli.rollout.hf import HFGenerator
from grpo_cli.rollout.prompts import PromptEncoder
from grpo_cli.training.layout import router_aux_coefficient, training_layout
from grpo_cli.training.sharding import decoder_layers

COLUMNS = ("sampling", "layout", "lora", "fsdp", "export")  # the support matrix's columns, in its order
HEADINGS = {
    "sampling": "sampling loop",
    "layout": "training layout",
    "lora": "LoRA default targets",
    "fsdp": "FSDP blocks",
    "export": "export",
}
# Prompts of different lengths (left padding in the batch) and longer than the zoo's sliding windows
PROMPTS = ("What is 17 * 3? Answer:", "1+2=", "def add(a, b):\n    return")
GENERATIONS = 3  # completions per prompt: rows the fast loop repeats from one prefill
# Every ENDING-th token id also ends a completion here, so that rows finish at different steps and
# the loop drops them from its cache mid-sampling, as a trained model's answers of varied length do
ENDING = 8
MAX_NEW_TOKENS = 12  # past the zoo's windows (4 tokens), so a window that is ignored shows
SAMPLER_TOLERANCE = 1e-4  # issue 53: sampler = forward at fp32; the sampler's incremental cache reorders sums
LAYOUT_TOLERANCE = 1e-5  # packed = padded at fp32: the same tokens attend, only the batch shape differs


@dataclass(frozen=True)
class Finding:
    """One check's result: the matrix cell, and the line `grpo check` prints under it."""

    column: str  # COLUMNS
    cell: str  # what the support matrix shows: fast | generate, packed | padded, the LoRA targets, ...
    detail: str  # the figures or the reason, one line
    failed: bool = False  # an equality that must hold did not: training this model would be wrong
    reason: str = ""  # why the cell is not the full support (generate, padded, layers without LoRA): a note

    @property
    def shown(self) -> str:
        """The matrix cell: a failed equality says so in the cell itself."""
        return f"{self.cell} (FAILS)" if self.failed else self.cell

    @property
    def note(self) -> str:
        """What the matrix's notes say under the table ('' for a cell that needs none)."""
        return self.detail if self.failed else self.reason


@dataclass(frozen=True)
class ModelReport:
    """Every check on one model: one row of the support matrix."""

    model_type: str
    findings: tuple[Finding, ...]

    @property
    def failed(self) -> bool:
        return any(finding.failed for finding in self.findings)

    def cell(self, column: str) -> Finding:
        return next(finding for finding in self.findings if finding.column == column)

    def table_row(self, before: tuple[str, ...] | None = None, after: tuple[str, ...] = ()) -> str:
        """This model's row of the support matrix (markdown), between `before` (default: its model_type)
        and `after` columns."""
        cells = (*(before or (self.model_type,)), *(self.cell(c).shown for c in COLUMNS), *after)
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    def lines(self) -> list[str]:
        """What `grpo check` prints under the row: each check's figures or reason, then the verdict."""
        checks = [f"{'FAIL' if f.failed else 'ok  '} {f.column}: {f.detail}" for f in self.findings]
        verdict = "some equalities FAIL: training this model would be wrong" if self.failed else "all equalities hold"
        return [*checks, verdict]


def matrix_header(before: tuple[str, ...] = ("model",), after: tuple[str, ...] = ()) -> list[str]:
    """The support matrix's heading and rule lines (markdown), with the columns `table_row` fills."""
    headings = (*before, *(HEADINGS[c] for c in COLUMNS), *after)
    return ["| " + " | ".join(headings) + " |", "|" + "---|" * len(headings)]


def check_model_config(cfg: ModelConfig, seed: int = 0) -> ModelReport:
    """Every check on the model `cfg` names, loaded as `grpo train` loads it (load_policy: its tokenizer
    left-padded, dropout off) but always on the CPU in fp32, where the equalities' tolerances hold;
    the tiny model is built in a temporary directory."""
    cfg = dataclasses.replace(cfg, dtype="fp32")  # bf16 rounding would fail every equality
    with tempfile.TemporaryDirectory(prefix="grpo-check-") as workdir:
        model, tokenizer, _ = load_policy(cfg, Path(workdir), seed, torch.device("cpu"), "fp32")
        return check_model(model, tokenizer, cfg.trust_remote_code, seed)


def check_model(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, trust_remote_code: bool = False, seed: int = 0
) -> ModelReport:
    """Every check on an fp32 `model` in eval mode (no dropout: the sampler's view). The LoRA check
    runs last and puts adapters on the model itself (no second copy of a user's weights in memory):
    the model is spent afterwards. `trust_remote_code`: how it was loaded, for the reload."""
    model.eval()
    model_type = model.config.model_type
    rollout_cfg = RolloutConfig(num_generations=GENERATIONS, max_new_tokens=MAX_NEW_TOKENS)
    torch.manual_seed(seed)
    sampling, rollout = check_sampling(model, tokenizer, rollout_cfg)
    findings = [
        sampling,
        check_layout(model, rollout, rollout_cfg.temperature),
        check_fsdp(model),
        check_export(model, tokenizer, trust_remote_code),
        check_lora(model),
    ]
    by_column = {finding.column: finding for finding in findings}
    return ModelReport(model_type, tuple(by_column[column] for column in COLUMNS))


def _max_difference(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    """Largest |a - b| where `mask` is set; NaN anywhere there is infinite (it fails every tolerance)."""
    gap = (a - b).abs()[mask.bool()]
    return math.inf if gap.isnan().any() else float(gap.max()) if gap.numel() else 0.0


def prompts_batch(tokenizer: PreTrainedTokenizerBase, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The check's prompts as the trainer encodes them (left-padded)."""
    return PromptEncoder(tokenizer, 128, device)(list(PROMPTS))


@torch.no_grad()
def sampled_with_logps(
    generator: FastGenerator | HFGenerator,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    cfg: RolloutConfig,
) -> tuple[Rollout, torch.Tensor]:
    """A rollout of the check's prompts from `generator`'s loop, and the log-probs [N, C] (at the
    temperature) that loop computed for the tokens it drew."""
    ids, mask = prompts_batch(tokenizer, next(model.parameters()).device)
    g, was_training = cfg.num_generations, model.training
    generator = copy.copy(generator)  # the caller's keeps its own EOS ids
    generator.eos_ids = sorted({*generator.eos_ids, *range(ENDING - 1, len(tokenizer), ENDING)})
    model.eval()
    try:
        if isinstance(generator, FastGenerator):
            completion_ids, logps = generator.sample(ids, mask, g, scored=True)
        else:
            settings = copy.deepcopy(generator.sampling)
            settings.output_logits, settings.return_dict_in_generate = True, True
            settings.eos_token_id = generator.eos_ids
            out = model.generate(
                input_ids=ids.repeat_interleave(g, 0),
                attention_mask=mask.repeat_interleave(g, 0),
                generation_config=settings,
            )
            completion_ids = out.sequences[:, ids.size(1) :]
            logits = torch.stack(out.logits, 1).float() / cfg.temperature
            logps = logits.log_softmax(-1).gather(2, completion_ids.unsqueeze(2)).squeeze(2)
    finally:
        model.train(was_training)
    rollout = finish_rollout(
        ids.repeat_interleave(g, 0), mask.repeat_interleave(g, 0), completion_ids, generator.eos_ids, tokenizer, g
    )
    return rollout, logps[:, : rollout.completion_ids.size(1)]


def check_sampling(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, cfg: RolloutConfig
) -> tuple[Finding, Rollout | None]:
    """The loop `grpo train` picks for this model, and sampler = forward on what it sampled."""
    generator, line = make_generator(model, tokenizer, cfg)
    loop = "fast" if isinstance(generator, FastGenerator) else "generate"
    why = line.partition(" (")[2].removesuffix(")") if loop == "generate" else ""
    if line == "fast, fixed-shape decode":  # rollout.fixed_decode: the family's layers computed by grpo itself
        loop = "fast, fixed-shape"
    try:
        rollout, sampled = sampled_with_logps(generator, model, tokenizer, cfg)
    except Exception as err:  # the loop crashed on this model: what the trainer would hit in its first rollout
        return Finding("sampling", loop, f"the {loop} loop fails: {type(err).__name__}: {err}", failed=True), None
    rows = torch.arange(rollout.completion_ids.size(0))
    with torch.no_grad():
        forward, _ = rows_logprobs(model, rollout, rows, cfg.temperature, "padded", with_entropy=False)
    gap = _max_difference(sampled, forward, rollout.completion_mask)
    held = gap <= SAMPLER_TOLERANCE
    detail = (
        f"{loop} loop{f' ({why})' if why else ''}: sampler log-probs vs a fresh forward, max |diff| {gap:.2g} "
        f"over {int(rollout.completion_mask.sum())} tokens, rows of {len(set(rollout.lengths.tolist()))} lengths "
        f"({'<=' if held else '>'} {SAMPLER_TOLERANCE:g})"
    )
    return Finding("sampling", loop, detail, failed=not held, reason=why), rollout


def check_layout(model: PreTrainedModel, rollout: Rollout | None, temperature: float) -> Finding:
    """The layout `train.layout=auto` trains this model in (training.layout), and packed = padded
    per-token log-probs wherever packed is offered; else the reason it is refused."""
    refused = packed_unsupported(model)
    if refused is not None:
        detail = f"train.layout=packed is refused: {refused}; auto trains padded"
        return Finding("layout", "padded", detail, reason=f"packed is refused: {refused}")
    if rollout is None:
        return Finding("layout", "untested", "no rollout to compare layouts on (sampling failed)", failed=True)
    rows = torch.arange(rollout.completion_ids.size(0))
    try:
        with torch.no_grad():
            packed, _ = rows_logprobs(model, rollout, rows, temperature, "packed", with_entropy=False)
            padded, _ = rows_logprobs(model, rollout, rows, temperature, "padded", with_entropy=False)
    except Exception as err:  # e.g. an attention that cannot take the packed 4-D mask
        return Finding("layout", "packed", f"the packed layout fails: {type(err).__name__}: {err}", failed=True)
    gap = _max_difference(packed, padded, rollout.completion_mask)
    held = gap <= LAYOUT_TOLERANCE
    equality = "packed = padded" if held else "packed != padded"
    figures = (
        f"packed vs padded per-token log-probs, max |diff| {gap:.2g} ({'<=' if held else '>'} {LAYOUT_TOLERANCE:g})"
    )
    layout, line = training_layout("auto", model, router_aux_coefficient(None, model))
    if layout == "padded":  # offered, but auto keeps padded rows (the router's auxiliary loss)
        why = line.partition(" (")[2].removesuffix(")")
        cell = f"padded for the router loss ({equality})"
        return Finding("layout", cell, f"{figures}; auto trains padded: {why}", not held, why)
    return Finding("layout", equality, f"{figures}; auto packs where it costs less", failed=not held)


def check_lora(model: PreTrainedModel) -> Finding:
    """The modules the default `model.lora.target_modules` puts adapters on, and how many decoder
    layers get one: a layer without any (a hybrid's other layer kind, say) does not train under LoRA."""
    lora = LoraConfig()
    try:
        adapted = add_lora(model, lora)
    except GrpoError as err:
        return Finding("lora", "none found", f"the default target_modules find nothing: {err}", reason=str(err))
    names = sorted({name.rsplit(".", 1)[-1] for name in adapted.targeted_module_names})
    try:
        layers = decoder_layers(adapted)
    except GrpoError:
        layers = []
    covered = sum(any(is_peft_layer(m) for m in layer.modules()) for layer in layers)
    where = f" in {covered} of {len(layers)} decoder layers" if layers else ""
    partial = bool(layers) and covered < len(layers)
    cell = ", ".join(names) + (f" ({covered}/{len(layers)} layers)" if partial else "")
    reason = f"{len(layers) - covered} of {len(layers)} decoder layers get no adapter" if partial else ""
    detail = f"default target_modules adapt {len(adapted.targeted_module_names)} modules{where}"
    return Finding("lora", cell, detail, reason=reason)


def is_peft_layer(module: torch.nn.Module) -> bool:
    """A module peft put an adapter on."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return isinstance(module, BaseTunerLayer)


def check_fsdp(model: PreTrainedModel) -> Finding:
    """The blocks `fully_shard` wraps one by one (training.sharding.decoder_layers)."""
    try:
        layers = decoder_layers(model)
    except GrpoError as err:
        return Finding("fsdp", "no blocks", str(err), reason=str(err))
    kinds = sorted({type(layer).__name__ for layer in layers})
    return Finding(
        "fsdp", f"{len(layers)} × {', '.join(kinds)}", f"fully_shard wraps {len(layers)} blocks ({', '.join(kinds)})"
    )


def check_export(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, trust_remote_code: bool) -> Finding:
    """Saved as `grpo export` saves it and reloaded with plain transformers: the same logits, within
    the export's own fp32 tolerance."""
    base = model.get_base_model() if is_peft(model) else model
    with tempfile.TemporaryDirectory(prefix="grpo-check-") as tmp:
        base.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            difference, tolerance = verify(
                Path(tmp), torch.float32, tokenizer, prompt_logits(base, tokenizer), trust_remote_code
            )
        except Exception as err:  # transformers cannot read back what it wrote
            return Finding("export", "fails", f"reload failed: {type(err).__name__}: {err}", failed=True)
    held = difference <= tolerance
    detail = (
        f"saved and reloaded with AutoModelForCausalLM: max |logit diff| {difference:.2g} (tolerance {tolerance:.2g})"
    )
    return Finding("export", "reloads" if held else "differs", detail, failed=not held)
