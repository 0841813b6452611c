"""Per-token log-probabilities of completions under a model."""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from grpo_cli.core.packing import attention_pattern, choose_layout, pack, packing_unsupported, prompt_groups
from grpo_cli.core.parallel import unwrap

# Logit elements upcast to float32 at once (2**21: 8 MiB; 42 rows of a 49k vocabulary, 13 of 150k).
# A full-vocabulary fp32 copy of every row would be [B, C, V] * 4 bytes, gigabytes for a real model;
# and a chunk past glibc's 32 MiB mmap threshold is a fresh mapping each time, every page of it
# faulted in again: at 2**25 elements the pass over SmolLM2's 512 x 49k logits ran 3-4x slower.
CHUNK_ELEMENTS = 2**21


class _TokenLogprobs(torch.autograd.Function):
    """log softmax(z / T)[y] over rows of z, and each row's entropy, one chunk of rows in float32 at
    a time.

    Autograd through logsumexp would keep every chunk's fp32 copy alive until backward; this saves
    only the logits (already in memory, in their own dtype), the per-row logsumexp and entropy, and
    rebuilds the softmax chunk by chunk in backward. With s = z / T and p = softmax(s):
    d logp_y / dz_j = (1[j = y] - p_j) / T, and, for the entropy bonus (algo.entropy_coef),
    dH / dz_j = -p_j (s_j - sum_k p_k s_k) / T, where sum_k p_k s_k = logsumexp(s) - H.
    """

    @staticmethod
    def forward(
        ctx, logits: torch.Tensor, ids: torch.Tensor, temperature: float, chunk_rows: int, with_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = torch.empty(logits.size(0), dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(out)
        # H = logsumexp(s) - sum_j p_j s_j: one more pass over the chunk already in fp32
        entropy = torch.empty_like(out) if with_entropy else out.new_empty(0)
        for start in range(0, logits.size(0), chunk_rows):
            rows = slice(start, start + chunk_rows)
            scaled = logits[rows].float() / temperature
            lse[rows] = torch.logsumexp(scaled, dim=-1)
            out[rows] = scaled.gather(1, ids[rows].unsqueeze(1)).squeeze(1) - lse[rows]
            if with_entropy:
                p = (scaled - lse[rows].unsqueeze(1)).exp_()
                entropy[rows] = lse[rows] - (p * scaled).sum(-1)
        ctx.save_for_backward(logits, ids, lse, entropy)
        ctx.temperature, ctx.chunk_rows = temperature, chunk_rows
        ctx.set_materialize_grads(False)  # an unused output's gradient arrives as None: no pass for it
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        return out, entropy

    @staticmethod
    def backward(
        ctx, grad_out: torch.Tensor | None, grad_entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, None, None, None, None]:
        logits, ids, lse, entropy = ctx.saved_tensors
        temperature, chunk_rows = ctx.temperature, ctx.chunk_rows
        grad = torch.empty_like(logits)
        for start in range(0, logits.size(0), chunk_rows):
            rows = slice(start, start + chunk_rows)
            target = ids[rows].unsqueeze(1)
            ones = torch.ones_like(lse[rows]).unsqueeze(1)
            scaled = logits[rows].float() / temperature
            if grad_entropy is None:  # the log-prob term only: one fp32 buffer, built in place
                grad_rows = scaled.sub_(lse[rows].unsqueeze(1)).exp_().neg_().scatter_add_(1, target, ones)
                grad_rows.mul_((grad_out[rows] / temperature).unsqueeze(1))
            else:
                p = (scaled - lse[rows].unsqueeze(1)).exp_()
                mean_s = (lse[rows] - entropy[rows]).unsqueeze(1)
                grad_rows = scaled.sub_(mean_s).mul_(p).mul_((-grad_entropy[rows] / temperature).unsqueeze(1))
                if grad_out is not None:
                    p.neg_().scatter_add_(1, target, ones).mul_((grad_out[rows] / temperature).unsqueeze(1))
                    grad_rows.add_(p)
            grad[rows] = grad_rows
        return grad, None, None, None, None


def token_logprobs(
    logits: torch.Tensor, ids: torch.Tensor, temperature: float = 1.0, chunk_rows: int | None = None
) -> torch.Tensor:
    """log softmax(logits / temperature) at `ids`: logits [..., V], ids [...] -> float32 [...].

    Computed as logit_y / T - logsumexp(logits / T), `chunk_rows` rows at a time (default: as many
    as fit in CHUNK_ELEMENTS), so only one chunk is ever upcast to float32. Differentiable.

    >>> logits = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 3.0]])
    >>> ids = torch.tensor([0, 2])
    >>> torch.allclose(token_logprobs(logits, ids, 0.7, chunk_rows=1),
    ...                (logits / 0.7).log_softmax(-1).gather(1, ids[:, None]).squeeze(1))
    True
    """
    return token_logprobs_and_entropy(logits, ids, temperature, chunk_rows, with_entropy=False)[0]


def token_logprobs_and_entropy(
    logits: torch.Tensor,
    ids: torch.Tensor,
    temperature: float = 1.0,
    chunk_rows: int | None = None,
    with_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`token_logprobs` plus the entropy of each row's distribution softmax(logits / T), in nats:
    the policy's uncertainty where it sampled, from logits already computed. Both are
    differentiable (the entropy for algo.entropy_coef's bonus).

    >>> logits = torch.log(torch.tensor([[0.5, 0.25, 0.25], [1.0, 1e-9, 1e-9]]))
    >>> _, h = token_logprobs_and_entropy(logits, torch.tensor([0, 0]))
    >>> [round(v, 4) for v in h.tolist()]  # 1.5 bits = 1.0397 nats; a near-certain token: 0
    [1.0397, 0.0]
    """
    vocab = logits.size(-1)
    if chunk_rows is None:
        chunk_rows = max(1, CHUNK_ELEMENTS // vocab)
    flat, entropy = _TokenLogprobs.apply(
        logits.reshape(-1, vocab), ids.reshape(-1), float(temperature), chunk_rows, with_entropy
    )
    return flat.view(ids.shape), entropy.view(ids.shape) if with_entropy else entropy


class RowsPass(NamedTuple):
    """One forward pass's per-token results for a batch of rows."""

    logps: torch.Tensor  # [B, C] float32
    entropies: torch.Tensor  # [B, C], or empty without with_entropy
    aux_loss: torch.Tensor | None  # the router's load-balancing loss (a mixture-of-experts model, router_aux)


def completion_logprobs_and_entropy(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs [B, C] in float32 and, with `with_entropy`, each position's entropy [B, C].

    Logits are divided by the sampling temperature so the ratio compares the distribution the
    tokens were actually drawn from (as TRL does). Position ids follow the attention mask so
    left padding does not shift positions.
    """
    args = (prompt_ids, prompt_mask, completion_ids, completion_mask)
    logps, entropy, _ = padded_pass(model, *args, temperature, with_entropy)
    return logps, entropy


def padded_pass(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = True,
    router_aux: bool = False,
) -> RowsPass:
    """`completion_logprobs_and_entropy`, and with `router_aux` the load-balancing loss a
    mixture-of-experts model computes from its router logits over the rows' real tokens (the 2-D
    attention mask excludes the padding), as TRL's forward asks for it."""
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    c, length = completion_ids.size(1), input_ids.size(1)
    # [B, C + 1, V]: position t predicts completion token t; the last one predicts past the end. By
    # index, not `logits_to_keep=c + 1`: a slice is not contiguous, and a frozen model's matmul (the
    # reference's) then multiplies it by B copies of the output layer (fast.FastGenerator._prefill)
    keep = torch.arange(length - c - 1, length, device=input_ids.device)
    output = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        logits_to_keep=keep,
        use_cache=False,
        **({"output_router_logits": True} if router_aux else {}),
    )
    # Score a dummy token at the last position and drop it, rather than slicing the logits to
    # [:, :-1], which would make them non-contiguous and cost a [B, C, V] copy to flatten.
    ids = F.pad(completion_ids, (0, 1))
    logps, entropy = token_logprobs_and_entropy(output.logits, ids, temperature, with_entropy=with_entropy)
    aux_loss = output.aux_loss if router_aux else None
    return RowsPass(logps[:, :-1], entropy[:, :-1] if with_entropy else entropy, aux_loss)


def packed_completion_logprobs_and_entropy(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    groups: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`completion_logprobs_and_entropy` computed in the packed layout (`core.packing`): each
    group's prompt once, real tokens only; the same [B, C] results (equal to float rounding)."""
    dtype = next(model.parameters()).dtype
    pattern = attention_pattern(unwrap(model).config)
    batch = pack(prompt_ids, prompt_mask, completion_ids, completion_mask, groups, dtype, pattern)
    logits = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
    ).logits
    picked = logits[batch.source_row, batch.source_position]  # [B, C, V]: where each token was predicted
    return token_logprobs_and_entropy(picked, completion_ids, temperature, with_entropy=with_entropy)


class RolloutRows(Protocol):
    """What the update reads of a rollout batch (rollout.base.Rollout has it): G completions per
    prompt, group by group, prompts left-padded and completions right-padded."""

    prompt_ids: torch.Tensor  # [N, P]
    prompt_mask: torch.Tensor  # [N, P]
    completion_ids: torch.Tensor  # [N, C]
    completion_mask: torch.Tensor  # [N, C]
    group_size: int  # G: rows g*G .. g*G+G-1 share a data prompt (an environment's reset may add to each)
    engine_logps: torch.Tensor | None  # [N, C] the sampling engine's log-probs where it is not the policy


def rows_logprobs(
    model: torch.nn.Module,
    rollout: RolloutRows,
    rows: torch.Tensor,
    temperature: float,
    layout: str,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs (and entropies) [len(rows), C] of these rollout rows, in the layout `layout`
    picks for them (`core.packing.choose_layout`): the one forward pass every update pass makes."""
    logps, entropies, _ = rows_pass(model, rollout, rows, temperature, layout, with_entropy)
    return logps, entropies


def rows_pass(
    model: torch.nn.Module,
    rollout: RolloutRows,
    rows: torch.Tensor,
    temperature: float,
    layout: str,
    with_entropy: bool,
    router_aux: bool = False,
) -> RowsPass:
    """`rows_logprobs`, and with `router_aux` the router's load-balancing loss of the pass, which
    only the padded layout computes (the trainer keeps padded for it: training.layout)."""
    prompt_ids, prompt_mask = rollout.prompt_ids[rows], rollout.prompt_mask[rows]
    completion_ids, completion_mask = rollout.completion_ids[rows], rollout.completion_mask[rows]
    groups = prompt_groups(prompt_ids, prompt_mask)  # not rows // G: an environment's reset may differ per row
    config = unwrap(model).config
    if layout != "padded" and (reason := packing_unsupported(config)) is not None:
        if layout == "packed":  # the trainer refuses it at start-up (training.layout), naming the reason
            raise ValueError(f"the packed layout cannot train this model: {reason}")
        layout = "padded"  # e.g. flash attention takes no 4-D mask, a hybrid's recurrent layers
    args = (prompt_ids, prompt_mask, completion_ids, completion_mask)
    packed = choose_layout(layout, prompt_mask, completion_mask, groups, config.hidden_size) == "packed"
    if packed and not router_aux:
        logps, entropies = packed_completion_logprobs_and_entropy(model, *args, groups, temperature, with_entropy)
        return RowsPass(logps, entropies, None)
    return padded_pass(model, *args, temperature, with_entropy, router_aux)


# How far packed log-probs may be from padded ones on `packed_unsupported`'s probe: float rounding of
# differently shaped matmuls (1e-6 in float32, ~1e-2 in bf16), far below what a wrong mask gives (0.1-1).
PROBE_TOLERANCE = {torch.float32: 1e-3, torch.float64: 1e-6, torch.bfloat16: 0.1, torch.float16: 0.05}


@torch.no_grad()
def packed_unsupported(model: torch.nn.Module) -> str | None:
    """Why this model cannot be trained in the packed layout, or None once a probe proved the two
    layouts' log-probs equal on it: two prompts of different lengths, two completions each, longer
    than any sliding window or chunk the model has (up to 64 tokens), in both layouts.

    The config rules out what no mask can fix (`core.packing.packing_unsupported`); the probe catches
    what they cannot see, such as a family whose layers mask in a way of their own."""
    inner = unwrap(model)
    reason = packing_unsupported(inner.config)
    if reason is not None:
        return reason
    pattern = attention_pattern(inner.config)
    span = max(pattern.sliding_window or 0, pattern.chunk_size or 0)
    length = min(span + 3, 64) if span else 6
    parameter = next(model.parameters())
    vocab = inner.config.get_text_config().vocab_size
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (4, 5 + length), generator=generator).to(parameter.device)
    prompt_mask = torch.ones(4, 5, dtype=torch.long, device=parameter.device)
    prompt_mask[2:, :2] = 0  # the second prompt is shorter: left padding
    prompt_ids = torch.cat([ids[:1, :5]] * 2 + [ids[2:3, :5]] * 2) * prompt_mask
    completion_mask = torch.ones(4, length, dtype=torch.long, device=parameter.device)
    completion_mask[1::2, length - 2 :] = 0  # the second completion of each prompt ends earlier
    completion_ids = ids[:, 5:] * completion_mask
    args = (prompt_ids, prompt_mask, completion_ids, completion_mask)
    was_training = model.training
    model.eval()
    try:
        padded, _ = completion_logprobs_and_entropy(model, *args, with_entropy=False)
        packed, _ = packed_completion_logprobs_and_entropy(
            model, *args, prompt_groups(prompt_ids, prompt_mask), with_entropy=False
        )
    except Exception as err:  # a forward that takes no 4-D mask, or no mask per layer kind
        return f"its forward failed on the packed layout's mask ({type(err).__name__}: {err})"
    finally:
        model.train(was_training)
    gap = float(((packed - padded).abs() * completion_mask).max())
    tolerance = PROBE_TOLERANCE.get(parameter.dtype, 0.1)
    if not gap <= tolerance:
        return f"its packed log-probs differ from the padded ones by {gap:.2g} on a probe (tolerance {tolerance:g})"
    return None
