"""A sampling loop that computes only what a GRPO rollout needs, behind the Generator interface.

`generate` computes every prompt G times in prefill (its rows are G copies) and keeps decoding rows
that already hit EOS until the longest one ends, running its general machinery (stopping criteria,
processors for options we never use) at every token. Here each distinct prompt is prefilled once
and its KV cache repeated G times; a row that samples EOS leaves the batch (and the cache) at once;
the loop stops when every row is done. The next-token distribution is the one `generate` samples
from: the same transformers processors in its order on float32 logits (the repetition penalty, then
min_new_tokens' EOS ban; sampling adds the warpers temperature, top-k, top-p, min-p), then softmax,
and one draw from it (`sample_categorical`; argmax when greedy).

The cache's rows are repeated and dropped by one row index (`take_rows`), through the cache's own
`reorder_cache` (beam search's, on transformers' caches since well before 4.56; in 5.x every layer
kind applies it to all its states, the conv and recurrent states of linear-attention and Mamba
layers included) or, where that is wrong, the cache's `batch_select_indices` (MiniMax keeps its
linear states beside the layers and moves them there only). `probe_rows` runs the loop's own steps
on two prompts and checks the logits against a fresh forward, so the operation is chosen by what it
does, not by the methods a cache has. Models where neither works (an encoder-decoder; MiniMax ending
on a full-attention layer; Mamba, whose one-token step misreads the loop's attention mask), and
`rollout.generation_kwargs` (generate's other options, none of which this loop has), keep
`generate`; `rollout.engine.make_generator` picks and says which, and why.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from grpo_cli.config.schema import RolloutConfig
from grpo_cli.errors import GrpoError
from grpo_cli.rollout.base import Rollout, TokenProgress, finish_rollout
from grpo_cli.rollout.hf import eos_token_ids
from grpo_cli.rollout.sampling_copy import SamplingCopy


def warpers(cfg: RolloutConfig) -> LogitsProcessorList:
    """The warpers `generate` applies for these sampling settings, in its order; a setting at its
    neutral value adds none, as in `generate`."""
    chain = LogitsProcessorList()
    if cfg.temperature != 1.0:
        chain.append(TemperatureLogitsWarper(cfg.temperature))
    if cfg.top_k > 0:
        chain.append(TopKLogitsWarper(cfg.top_k))
    if cfg.top_p < 1.0:
        chain.append(TopPLogitsWarper(cfg.top_p))
    if cfg.min_p is not None:
        chain.append(MinPLogitsWarper(cfg.min_p))
    return chain


def settings_unsupported(cfg: RolloutConfig) -> str | None:
    """Why the fast loop cannot sample with these settings, or None. It has `generate`'s processors
    for the rollout.* keys only; `rollout.generation_kwargs` names any of generate's other options,
    which it would silently ignore."""
    if cfg.generation_kwargs:
        return f"rollout.generation_kwargs ({', '.join(sorted(cfg.generation_kwargs))}) are options of generate"
    return None


def sample_categorical(probs: torch.Tensor, stream: torch.Generator | None = None) -> torch.Tensor:
    """One draw per row from `probs` [rows, V] by inverting the cumulative distribution: one uniform
    number per row, where `torch.multinomial` costs 8x more at 259 tokens on CPU and 2x at 150k.

    The CDF and the uniform are float64: in float32 both have 24 bits, so past a token of mass ~1
    every token under ~3e-8 gets an interval no uniform can hit and is never drawn (130k of 152k in
    a peaked distribution), and the rest are off by 1e-3 in total variation. In float64 that limit
    is ~1e-16. A token of probability 0 (cut by top-k or top-p) is never drawn.

    >>> sample_categorical(torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])).tolist()
    [1, 2]
    """
    if probs.device.type == "mps":  # no float64 there: the draw is cheap next to the forward anyway
        return sample_categorical(probs.cpu(), stream).to(probs.device)
    cdf = probs.cumsum(-1, dtype=torch.float64)
    total = cdf[:, -1:]
    target = torch.rand(probs.size(0), 1, dtype=torch.float64, device=cdf.device, generator=stream) * total
    # u * total may round up to total: below it, the draw lands on a token with mass, never a cut one
    target = torch.minimum(target, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True).squeeze(1)


def cache_argument(model: PreTrainedModel) -> str:
    """The forward keyword a model takes its KV cache by: `cache` (transformers >= 5.20), else
    `past_key_values`. A PEFT wrapper takes **kwargs: its base model's signature decides."""
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def returned_cache(output: Any) -> Any:
    """The KV cache a forward returned, under either name."""
    cache = output.get("cache") if hasattr(output, "get") else None
    return cache if cache is not None else output.past_key_values


# The cache methods that keep a list of rows, in the order the probe tries them: beam search's,
# which every transformers layer kind implements on all its states, then the cache's batch helper
# (right where a cache class keeps states outside its layers and overrides only that one)
ROW_OPERATIONS = ("reorder_cache", "batch_select_indices")


def take_rows(cache: Any, rows: torch.Tensor, operation: str = ROW_OPERATIONS[0]) -> None:
    """Keep the cache rows `rows`, in that order, with the cache's method `operation`: one index both
    repeats rows (each prompt's G times after its one prefill) and drops them (finished completions)."""
    getattr(cache, operation)(rows)


def prefill(
    net: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor
) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """One forward over the left-padded prompts: their cache, the float32 logits at the last prompt
    token [B, V], and each row's position for the next token [B, 1]."""
    positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    # the last position by index, not `logits_to_keep=1`: a slice of [B, P, H] is not contiguous,
    # and with frozen weights (the bf16 copy) torch's matmul then multiplies it by B contiguous
    # copies of the output layer (SmolLM2's: 290 ms, against a few ms for an index)
    last = torch.tensor([prompt_ids.size(1) - 1], device=prompt_ids.device)
    out = net(
        input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions, use_cache=True, logits_to_keep=last
    )
    return returned_cache(out), out.logits[:, -1].float(), positions[:, -1:] + 1


def decode(
    net: torch.nn.Module, cache: Any, keyword: str, token: torch.Tensor, mask: torch.Tensor, position: torch.Tensor
) -> torch.Tensor:
    """One token per running row through the cache: the next float32 logits [rows, V]. `mask` covers
    the prompt, the completion so far and `token`; `position` is the token's; `keyword` is
    `cache_argument`'s."""
    step = {"input_ids": token.unsqueeze(1), "attention_mask": mask, "position_ids": position, keyword: cache}
    out = net(**step, use_cache=True)
    return out.logits[:, -1].float()


# How far the cached logits may be from a fresh forward's, relative to the largest logit: float
# rounding summed in another order (fp32: <= 5e-7 on the zoo, 3e-6 on SmolLM2-135M; bf16 and fp16:
# <= 5e-3 on the zoo's Mamba hybrids, 0 on SmolLM2), where a row taken from the wrong place, or a
# state left behind, is off by the logits' own spread (0.4-0.8 measured)
PROBE_TOLERANCE = {torch.float32: 1e-3, torch.float64: 1e-3}
LOW_PRECISION_TOLERANCE = 0.1  # bf16, fp16


FORWARD_FAILED = "its forward failed on a probe"  # no row operation can help: fast_loop_rows stops there


@torch.no_grad()
def probe_rows(model: torch.nn.Module, operation: str) -> str | None:
    """Why repeating and dropping cache rows with `operation` does not work on this model, or None:
    the loop's own steps on two prompts of different lengths (left padding), prefilled, each row
    repeated twice, a token, one row dropped, another token, against a fresh forward without a cache
    of the same sequences. A few tokens through the model: cheap enough for every start."""
    parameter = next(model.parameters())
    device, keyword = parameter.device, cache_argument(model)
    vocab = model.get_input_embeddings().num_embeddings
    prompts = (torch.arange(10, device=device).view(2, 5) * 7 + 3) % vocab  # arbitrary ids
    prompt_mask = torch.ones_like(prompts)
    prompt_mask[1, :2] = 0  # the second prompt is shorter: left-padded by 2
    repeat = torch.tensor([0, 0, 1, 1], device=device)  # each prompt's row twice
    keep = torch.tensor([0, 2, 3], device=device)  # drops a copy of the first prompt, as a finished row
    tokens = (torch.arange(8, device=device).view(4, 2) * 11 + 5) % vocab  # two tokens a row, each row its own
    full = torch.cat([prompts[repeat], tokens], dim=1)[keep]
    mask = torch.cat([prompt_mask[repeat], prompt_mask.new_ones(4, 2)], dim=1)
    try:
        cache, first, position = prefill(model, prompts, prompt_mask)
    except Exception as err:  # a model whose forward takes other arguments
        return f"{FORWARD_FAILED} ({type(err).__name__}: {str(err)[:160]})"
    try:
        take_rows(cache, repeat, operation)
        second = decode(model, cache, keyword, tokens[:, 0], mask[:, :6], position[repeat])
        take_rows(cache, keep, operation)
        third = decode(model, cache, keyword, tokens[keep, 1], mask[keep], position[repeat][keep] + 1)
    except Exception as err:  # a method that cannot index rows, or states it left behind that the next step trips on
        return f"its cache's rows taken by {operation} fail ({type(err).__name__}: {str(err)[:160]})"
    cached = torch.stack([first[repeat][keep], second[keep], third], dim=1)
    positions = (mask[keep].cumsum(-1) - 1).clamp(min=0)
    fresh = model(input_ids=full, attention_mask=mask[keep], position_ids=positions, use_cache=False).logits[:, 4:]
    gap = float((cached - fresh.float()).abs().max() / fresh.float().abs().max().clamp(min=1e-6))
    if not gap <= PROBE_TOLERANCE.get(parameter.dtype, LOW_PRECISION_TOLERANCE):  # `not <=`: a NaN gap fails too
        return (
            f"its cached decoding, rows repeated and dropped by {operation}, gives logits {gap:.0e} away "
            "from a fresh forward's"
        )
    return None


class FastGenerator:
    """Prefill once per prompt, decode only the rows still running (module docstring)."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        cfg: RolloutConfig,
        sampling_copy: SamplingCopy | None = None,
        row_operation: str = ROW_OPERATIONS[0],
        seeded_per_step: bool = False,
    ) -> None:
        reason = settings_unsupported(cfg)
        if reason is not None:  # a library caller's FastGenerator: make_generator already chose generate
            raise GrpoError(f"the fast loop cannot sample with {reason}: use rollout.loop=generate")
        self.model = model
        self.copy = sampling_copy  # rollout.sampling_weights: sampled rollouts from it, greedy ones from the policy
        self.temperature = cfg.temperature
        self.tokenizer = tokenizer
        self.max_new_tokens = cfg.max_new_tokens
        self.min_new_tokens = cfg.min_new_tokens
        self.repetition_penalty = cfg.repetition_penalty
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.warpers = warpers(cfg)
        self.pad_id = tokenizer.pad_token_id
        self.cache_argument = cache_argument(model)
        self.row_operation = row_operation  # the cache method that repeats and drops rows (probe_rows chose it)
        self.on_token: TokenProgress | None = None  # told after each token (Generator)
        # seeded_per_step: draws from a stream of its own, seeded by set_step_seed (the asynchronous
        # sampler's thread, which must neither race the trainer's stream nor depend on when it runs);
        # else from torch's, which the trainer carries (RngState)
        self.stream = torch.Generator(device=model.device).manual_seed(0) if seeded_per_step else None

    def weights_updated(self) -> None:
        """The bf16 copy, when sampling from one, takes the updated weights; else nothing to refresh."""
        if self.copy is not None:
            self.copy.refresh()

    def set_step_seed(self, seed: int) -> None:
        """Seeds this loop's own stream where it has one; else nothing to seed: it draws from torch's
        stream, which the trainer carries (Generator)."""
        if self.stream is not None:
            self.stream.manual_seed(seed)

    def close(self) -> None:
        """Nothing held beyond the policy module (Generator)."""

    @torch.no_grad()
    def generate(
        self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, num_generations: int, greedy: bool = False
    ) -> Rollout:
        net = self.model if greedy or self.copy is None else self.copy.module
        was_training = net.training
        net.eval()
        try:
            completion_ids, logps = self.sample(prompt_ids, prompt_mask, num_generations, greedy, net)
        finally:
            net.train(was_training)
        rollout = finish_rollout(
            prompt_ids.repeat_interleave(num_generations, dim=0),
            prompt_mask.repeat_interleave(num_generations, dim=0),
            completion_ids,
            self.eos_ids,
            self.tokenizer,
            num_generations,
        )
        if net is not self.model:  # the copy's log-probs, for algo.rollout_correction and rollout/engine_gap
            rollout.engine_logps = logps[:, : rollout.completion_ids.size(1)]
        return rollout

    def _next_token(self, logits: torch.Tensor, greedy: bool, step: int, rows: torch.Tensor, g: int) -> torch.Tensor:
        """The next token of each running row (`rows`: their indices in the batch of completions).

        NaN logits (diverged weights) would otherwise be drawn silently (argmax picks the NaN, the
        CDF lands past the last id) and training would go on from nonsense."""
        scores = logits if greedy else self.warpers(None, logits).softmax(-1)
        broken = scores.isnan().any(-1)
        if broken.any():
            row = int(rows[broken.nonzero()[0, 0]])
            what = "logits" if greedy else "probabilities"
            raise GrpoError(
                f"NaN next-token {what} at token {step + 1} of completion row {row} (prompt {row // g} of the "
                f"batch, generation {row % g + 1} of {g}); {int(broken.sum())} of {rows.numel()} rows: the model's "
                "logits are NaN or +inf, i.e. its weights or activations diverged (a lower optim.lr, or precision=fp32)"
            )
        return scores.argmax(-1) if greedy else sample_categorical(scores, self.stream)

    def _prefill(
        self, net: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, g: int
    ) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """One forward per prompt, not per completion: its KV cache and last logits repeated G times
        (rows group by group), and each row's next position."""
        cache, logits, next_position = prefill(net, prompt_ids, prompt_mask)
        rows = torch.arange(prompt_ids.size(0), device=prompt_ids.device).repeat_interleave(g)
        take_rows(cache, rows, self.row_operation)
        return cache, logits[rows], next_position[rows]

    def sample(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        num_generations: int,
        greedy: bool = False,
        net: torch.nn.Module | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Completion ids [B·G, C], rows group by group, padded after each row's EOS; C is the
        longest completion (at most max_new_tokens). And [B·G, C] the log-probs of the sampled tokens
        at the temperature (the trainer's definition) under `net`, NaN after a row's end: used only
        when `net` is not the policy (the bf16 copy), whose tokens the trainer scores itself."""
        g = num_generations
        net = self.model if net is None else net
        cache, logits, next_position = self._prefill(net, prompt_ids, prompt_mask, g)
        mask = prompt_mask.repeat_interleave(g, dim=0)
        seen = Context(prompt_ids.repeat_interleave(g, dim=0), mask) if self.repetition_penalty != 1.0 else None
        rows = logits.size(0)
        tokens = torch.full((rows, self.max_new_tokens), self.pad_id, dtype=prompt_ids.dtype, device=prompt_ids.device)
        logps = torch.full((rows, self.max_new_tokens), math.nan, device=prompt_ids.device)
        scored = net is not self.model
        running = torch.arange(rows, device=prompt_ids.device)  # which rows of `tokens` are still in the batch
        eos = torch.tensor(self.eos_ids, device=prompt_ids.device)
        steps = 0
        for step in range(self.max_new_tokens):
            scores = logits if seen is None else seen.penalised(logits, self.repetition_penalty)
            if step < self.min_new_tokens:  # as generate's MinNewTokensLengthLogitsProcessor
                scores = scores.index_fill(1, eos, -math.inf)
            token = self._next_token(scores, greedy, step, running, g)
            tokens[running, step] = token
            if scored:
                chosen = (logits / self.temperature).log_softmax(-1).gather(1, token.unsqueeze(1)).squeeze(1)
                logps[running, step] = chosen
            steps = step + 1
            if self.on_token is not None:
                self.on_token(steps, self.max_new_tokens)
            going = ~torch.isin(token, eos)
            if step + 1 == self.max_new_tokens or not going.any():
                break
            if seen is not None:
                seen.append(token)
            if not going.all():  # finished rows leave the batch and the cache
                keep = going.nonzero().squeeze(1)
                running, token, mask, next_position = running[keep], token[keep], mask[keep], next_position[keep]
                take_rows(cache, keep, self.row_operation)
                if seen is not None:
                    seen.select(keep)
            mask = torch.cat([mask, mask.new_ones(mask.size(0), 1)], dim=1)
            logits = decode(net, cache, self.cache_argument, token, mask, next_position)
            next_position = next_position + 1
        return tokens[:, :steps], logps[:, :steps]


class Context:
    """The running rows' token ids so far (prompt and completion), which the repetition penalty reads.

    The prompt's left padding is no part of the context: `generate` passes each row's padding length
    as `prompt_ignore_length`, and so does this, with the same processor, so a penalised pad (often an
    EOS id) never depends on how long the other prompts of the batch were.
    """

    def __init__(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> None:
        self.ids = prompt_ids
        self.padding = (prompt_mask != 0).int().argmax(dim=1)  # as generate computes it

    def penalised(self, logits: torch.Tensor, penalty: float) -> torch.Tensor:
        return RepetitionPenaltyLogitsProcessor(penalty, prompt_ignore_length=self.padding)(self.ids, logits)

    def append(self, token: torch.Tensor) -> None:
        self.ids = torch.cat([self.ids, token.unsqueeze(1)], dim=1)

    def select(self, rows: torch.Tensor) -> None:
        self.ids, self.padding = self.ids[rows], self.padding[rows]
