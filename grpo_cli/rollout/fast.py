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

Plain decoders (Llama, Qwen2/3, Mistral without a window) decode instead through
`rollout.fixed_decode`: after the same prefill, a preallocated cache and a step of fixed shape in
which finished rows stay, masked.
"""

from __future__ import annotations

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
from grpo_cli.module_mode import evaluating
from grpo_cli.rollout import fixed_decode
from grpo_cli.rollout.base import Rollout, TokenProgress, finish_rollout
from grpo_cli.rollout.fixed_decode import FixedShapeDecoder
from grpo_cli.rollout.forward_steps import cache_argument, decode, prefill
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


# The cache methods that keep a list of rows, in the order the probe tries them: beam search's,
# which every transformers layer kind implements on all its states, then the cache's batch helper
# (right where a cache class keeps states outside its layers and overrides only that one)
ROW_OPERATIONS = ("reorder_cache", "batch_select_indices")


def take_rows(cache: Any, rows: torch.Tensor, operation: str = ROW_OPERATIONS[0]) -> None:
    """Keep the cache rows `rows`, in that order, with the cache's method `operation`: one index both
    repeats rows (each prompt's G times after its one prefill) and drops them (finished completions)."""
    getattr(cache, operation)(rows)


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
        fixed: bool = True,
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
        # fixed: decode plain decoders with rollout.fixed_decode (rollout.loop auto or fixed); per module
        # sampled from (the policy, the copy), its decoder or None where its probe failed, and the first reason
        self.fixed = fixed
        self.decoders: dict[int, tuple[torch.nn.Module, FixedShapeDecoder | None]] = {}
        self.fixed_reason: str | None = None
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
        with evaluating(net):
            completion_ids, logps = self.sample(prompt_ids, prompt_mask, num_generations, greedy, net)
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
        broken = scores.sum(-1).isnan()  # a NaN anywhere in a row: one reduction, not a [rows, V] mask
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
        scored: bool | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Completion ids [B·G, C], rows group by group, padded after each row's EOS; C is the
        longest completion (at most max_new_tokens). And [B·G, C] the log-probs of the sampled tokens
        at the temperature (the trainer's definition) under `net`, NaN after a row's end: computed
        when `scored` (default: when `net` is not the policy, i.e. the bf16 copy, whose tokens the
        trainer does not score itself); else NaN throughout."""
        net = self.model if net is None else net
        scored = net is not self.model if scored is None else scored
        decoder = self.decoder(net)
        if decoder is not None:
            return self._sample_fixed(decoder, net, prompt_ids, prompt_mask, num_generations, greedy, scored)
        return self._sample_dropping(net, prompt_ids, prompt_mask, num_generations, greedy, scored)

    def decoder(self, net: torch.nn.Module) -> FixedShapeDecoder | None:
        """The fixed-shape decoder of `net` (the policy or the copy), probed the first time it samples;
        None where the loop decodes through the model's forward (rollout.loop=fast, or the probe's
        reason, kept in `fixed_reason`)."""
        if not self.fixed:
            return None
        if id(net) not in self.decoders:  # the module is kept with its entry: its id cannot be reused
            dtype = next(net.parameters()).dtype
            reason = fixed_decode.probe(net, PROBE_TOLERANCE.get(dtype, LOW_PRECISION_TOLERANCE))
            self.decoders[id(net)] = (net, FixedShapeDecoder(net) if reason is None else None)
            self.fixed_reason = self.fixed_reason or reason
        return self.decoders[id(net)][1]

    def _outputs(self, rows: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The completion ids (pads) and log-probs (NaN) to fill, [rows, max_new_tokens]."""
        tokens = torch.full((rows, self.max_new_tokens), self.pad_id, dtype=like.dtype, device=like.device)
        return tokens, torch.full((rows, self.max_new_tokens), math.nan, device=like.device)

    def _choose(
        self,
        logits: torch.Tensor,
        seen: Context | None,
        step: int,
        greedy: bool,
        rows: torch.Tensor,
        g: int,
        scored: bool,
        eos: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The next token of each row of `logits` (`rows`: their indices in the batch) and, when
        `scored`, its log-prob at the temperature."""
        scores = logits if seen is None else seen.penalised(logits, self.repetition_penalty)
        if step < self.min_new_tokens:  # as generate's MinNewTokensLengthLogitsProcessor
            scores = scores.index_fill(1, eos, -math.inf)
        token = self._next_token(scores, greedy, step, rows, g)
        if not scored:
            return token, None
        return token, (logits / self.temperature).log_softmax(-1).gather(1, token.unsqueeze(1)).squeeze(1)

    def _sample_fixed(
        self,
        decoder: FixedShapeDecoder,
        net: torch.nn.Module,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        g: int,
        greedy: bool,
        scored: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`sample` with every row decoded at every step (a finished row's tokens are pads, never
        recorded) through `decoder`'s preallocated cache."""
        cache, logits, position = prefill(net, prompt_ids, prompt_mask)
        rows = torch.arange(prompt_ids.size(0), device=prompt_ids.device).repeat_interleave(g)
        capacity = prompt_ids.size(1) + self.max_new_tokens
        decoder.start(cache, rows, capacity)
        del cache
        logits, position = logits[rows], position[rows]
        bias = fixed_decode.padding_bias(prompt_mask[rows], capacity)
        seen = Context(prompt_ids[rows], prompt_mask[rows]) if self.repetition_penalty != 1.0 else None
        tokens, logps = self._outputs(rows.numel(), prompt_ids)
        every = torch.arange(rows.numel(), device=prompt_ids.device)
        running = torch.ones(rows.numel(), dtype=torch.bool, device=prompt_ids.device)
        eos = torch.tensor(self.eos_ids, device=prompt_ids.device)
        steps = 0
        try:
            for step in range(self.max_new_tokens):
                # draws for the running rows only, in order: the random stream goes as in _sample_dropping,
                # so a seed samples the same completions on either path
                live = every if bool(running.all()) else running.nonzero().squeeze(1)
                context = seen if seen is None or live is every else seen.subset(live)
                drawn, chosen = self._choose(logits[live], context, step, greedy, live, g, scored, eos)
                token = torch.full_like(every, self.pad_id).index_copy_(0, live, drawn.to(every.dtype))
                tokens[:, step] = token
                if chosen is not None:
                    logps[live, step] = chosen
                steps = step + 1
                if self.on_token is not None:
                    self.on_token(steps, self.max_new_tokens)
                running &= ~torch.isin(token, eos)
                if step + 1 == self.max_new_tokens or not running.any():
                    break
                if seen is not None:
                    seen.append(token)
                logits = decoder.step(token, position + step, bias[..., : decoder.length + 1])
        finally:
            decoder.release()  # the cache is the size of the batch: not held through the update
        return tokens[:, :steps], logps[:, :steps]

    def _sample_dropping(
        self,
        net: torch.nn.Module,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        g: int,
        greedy: bool,
        scored: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`sample` through the model's own forward and cache, finished rows leaving both."""
        cache, logits, next_position = self._prefill(net, prompt_ids, prompt_mask, g)
        mask = prompt_mask.repeat_interleave(g, dim=0)
        seen = Context(prompt_ids.repeat_interleave(g, dim=0), mask) if self.repetition_penalty != 1.0 else None
        tokens, logps = self._outputs(logits.size(0), prompt_ids)
        running = torch.arange(logits.size(0), device=prompt_ids.device)  # which rows of `tokens` are in the batch
        eos = torch.tensor(self.eos_ids, device=prompt_ids.device)
        steps = 0
        for step in range(self.max_new_tokens):
            token, chosen = self._choose(logits, seen, step, greedy, running, g, scored, eos)
            tokens[running, step] = token
            if chosen is not None:
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

    def subset(self, rows: torch.Tensor) -> Context:
        """The context of `rows` only, leaving this one whole (the fixed-shape loop keeps every row)."""
        part = Context.__new__(Context)
        part.ids, part.padding = self.ids[rows], self.padding[rows]
        return part
