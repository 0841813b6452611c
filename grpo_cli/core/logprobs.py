"""Per-token log-probabilities of completions under a model."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

# Logit elements upcast to float32 at once (2**25: 128 MiB): about 220 rows of a 150k vocabulary.
# A full-vocabulary fp32 copy of every row would be [B, C, V] * 4 bytes, gigabytes for a real model.
CHUNK_ELEMENTS = 2**25


class _TokenLogprobs(torch.autograd.Function):
    """log softmax(z / T)[y] over rows of z, one chunk of rows in float32 at a time.

    Autograd through logsumexp would keep every chunk's fp32 copy alive until backward; this saves
    only the logits (already in memory, in their own dtype) and the per-row logsumexp, and rebuilds
    the softmax chunk by chunk in backward: d/dz_j = (1[j = y] - softmax(z / T)_j) / T.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, ids: torch.Tensor, temperature: float, chunk_rows: int) -> torch.Tensor:
        out = torch.empty(logits.size(0), dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(out)
        for start in range(0, logits.size(0), chunk_rows):
            rows = slice(start, start + chunk_rows)
            scaled = logits[rows].float() / temperature
            lse[rows] = torch.logsumexp(scaled, dim=-1)
            out[rows] = scaled.gather(1, ids[rows].unsqueeze(1)).squeeze(1) - lse[rows]
        ctx.save_for_backward(logits, ids, lse)
        ctx.temperature, ctx.chunk_rows = temperature, chunk_rows
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        logits, ids, lse = ctx.saved_tensors
        temperature, chunk_rows = ctx.temperature, ctx.chunk_rows
        grad = torch.empty_like(logits)
        for start in range(0, logits.size(0), chunk_rows):
            rows = slice(start, start + chunk_rows)
            # -softmax(z / T), built in place in the chunk's fp32 copy, then + 1 at the target token
            minus_p = (logits[rows].float() / temperature).sub_(lse[rows].unsqueeze(1)).exp_().neg_()
            minus_p.scatter_add_(1, ids[rows].unsqueeze(1), torch.ones_like(lse[rows]).unsqueeze(1))
            grad[rows] = minus_p.mul_((grad_out[rows] / temperature).unsqueeze(1))
        return grad, None, None, None


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
    vocab = logits.size(-1)
    if chunk_rows is None:
        chunk_rows = max(1, CHUNK_ELEMENTS // vocab)
    flat = _TokenLogprobs.apply(logits.reshape(-1, vocab), ids.reshape(-1), float(temperature), chunk_rows)
    return flat.view(ids.shape)


def completion_logprobs(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """log pi(y_t | x, y_<t) for every completion token, [B, C], in float32.

    Logits are divided by the sampling temperature so the ratio compares the distribution the
    tokens were actually drawn from (as TRL does). Position ids follow the attention mask so
    left padding does not shift positions.
    """
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    c = completion_ids.size(1)
    # [B, C + 1, V]: position t predicts completion token t; the last one predicts past the end.
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        logits_to_keep=c + 1,
        use_cache=False,
    ).logits
    # Score a dummy token at the last position and drop it, rather than slicing the logits to
    # [:, :-1], which would make them non-contiguous and cost a [B, C, V] copy to flatten.
    ids = F.pad(completion_ids, (0, 1))
    return token_logprobs(logits, ids, temperature)[:, :-1]
