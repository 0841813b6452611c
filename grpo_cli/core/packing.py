"""Padding-free training passes: each prompt once, followed by its completions, in one row per group.

The padded layout computes every row as left-padded prompt + right-padded completion, so a group's
prompt is computed G times and every completion is as long as the longest one. Packed, a group is
one row `prompt | completion_1 | ... | completion_k` of real tokens only; a 4-D attention mask lets
each completion see its prompt and its own earlier tokens (nothing of its siblings), and position
ids restart after the prompt for every completion, so each token sees exactly what it saw in the
padded layout. Logits are gathered back into the padded [rows, C] shape the loss uses.

The rows packed together are those whose prompts are the same tokens (`prompt_groups`), not a
group's G rows as such: an environment's reset can add per-episode text to each row's prompt
(rollout.episodes), and then each row is its own packed row. `pack` refuses rows that claim a shared
prompt they do not have.

The mask reproduces each layer's attention as the model computes it over the padded rows: a
sliding-window layer sees the last `sliding_window` positions, a chunked layer (Llama 4) its chunk
of `attention_chunk_size` positions; distances are position ids, which in both layouts count from a
row's first real token. A model whose layers differ in kind takes one mask per kind (a dict keyed by
`config.layer_types`, as transformers' own masking builds it). Layers that carry a state from token
to token (linear attention, Mamba, short convolutions) would carry one completion's state into the
next packed one, which no mask prevents: such models are not packed (`packing_unsupported`).

Attention inside a packed row grows with the square of its length, so `choose_layout` keeps the
padded layout where that would cost more than the tokens saved (docs/architecture.md §3, "Training passes").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

PACKABLE_ATTENTION = ("eager", "sdpa")  # attention implementations that use a 4-D mask as given
MASKED_KINDS = ("full_attention", "sliding_attention", "chunked_attention")  # layer kinds the packed mask reproduces
TOKEN_WISE_KINDS = ("mlp", "moe")  # layer kinds that mix no tokens (Nemotron-H's MLP layers): nothing to mask


@dataclass(frozen=True)
class AttentionPattern:
    """What the packed mask reproduces of a model's attention: the kind of each layer and their spans."""

    kinds: tuple[str, ...]  # each decoder layer's kind (MASKED_KINDS or TOKEN_WISE_KINDS)
    sliding_window: int | None = None  # sliding_attention: a query sees the last `sliding_window` positions
    chunk_size: int | None = None  # chunked_attention: a query sees its chunk's earlier positions


def layer_kinds(config: Any) -> tuple[str, ...]:
    """Each decoder layer's kind as transformers' masking reads the config: `layer_types`, else every
    layer sliding when the config has a window (Mistral), chunked when it has a chunk, else full."""
    types = getattr(config, "layer_types", None)
    if types:
        return tuple(types)
    if getattr(config, "sliding_window", None) is not None:
        return ("sliding_attention",) * config.num_hidden_layers
    if getattr(config, "attention_chunk_size", None) is not None:
        return ("chunked_attention",) * config.num_hidden_layers
    return ("full_attention",) * config.num_hidden_layers


def packing_unsupported(config: Any) -> str | None:
    """Why a model with this (transformers) config cannot be trained in the packed layout, or None:
    its attention implementation takes no 4-D mask, or some layers are not attention the mask can
    reproduce (a recurrent or convolutional state would flow from one packed completion into the next)."""
    text = config.get_text_config() if callable(getattr(config, "get_text_config", None)) else config
    implementation = getattr(text, "_attn_implementation", None) or "sdpa"
    if implementation not in PACKABLE_ATTENTION:
        return f"its attention implementation ({implementation}) takes no 4-D mask"
    other = sorted(set(layer_kinds(text)) - set(MASKED_KINDS) - set(TOKEN_WISE_KINDS))
    if other:
        return (
            f"its {', '.join(other)} layers carry a state from token to token, which would flow from one packed "
            "completion into the next"
        )
    return None


def attention_pattern(config: Any) -> AttentionPattern:
    """The pattern `pack` builds masks for, from a model's config (`packing_unsupported` is None)."""
    text = config.get_text_config() if callable(getattr(config, "get_text_config", None)) else config
    kinds = layer_kinds(text)
    return AttentionPattern(
        kinds,
        getattr(text, "sliding_window", None) if "sliding_attention" in kinds else None,
        getattr(text, "attention_chunk_size", None) if "chunked_attention" in kinds else None,
    )


FULL_ATTENTION = AttentionPattern(("full_attention",))


@dataclass
class PackedBatch:
    """A micro-batch in the packed layout, and where each completion token's logits come from."""

    input_ids: torch.Tensor  # [K, T], K groups (distinct prompts) in the micro-batch
    position_ids: torch.Tensor  # [K, T]
    # [K, 1, T, T] additive: 0 where a query may look, dtype min elsewhere; per layer kind (a dict keyed
    # by config.layer_types) when the model's layers attend differently
    attention_mask: torch.Tensor | dict[str, torch.Tensor]
    source_row: torch.Tensor  # [n, C]: the packed row whose logits predict completion token (r, j)
    source_position: torch.Tensor  # [n, C]: ... and the position in it


def prompt_groups(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
    """[n] a group id per row, shared by the rows whose prompts are the same tokens, numbered in the
    order of their first row (a Rollout's G rows per prompt: `rows // G`).

    >>> prompt_groups(torch.tensor([[0, 5], [0, 5], [4, 5], [9, 5]]), torch.tensor([[0, 1], [0, 1], [1, 1], [0, 1]]))
    tensor([0, 0, 1, 0])
    """
    n = prompt_ids.size(0)
    key = torch.cat([prompt_ids * prompt_mask, prompt_mask], 1)  # the pad id under the mask is no part of a prompt
    _, inverse = torch.unique(key, dim=0, return_inverse=True)
    rows = torch.arange(n, device=prompt_ids.device)
    first = torch.full((n,), n, dtype=torch.long, device=prompt_ids.device).scatter_reduce_(
        0, inverse, rows, reduce="amin"
    )
    rank = torch.empty_like(first)
    rank[first.argsort()] = rows  # unused ids (first = n) sort last and are never looked up
    return rank[inverse]


def pack(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    groups: torch.Tensor,
    dtype: torch.dtype,
    attention: AttentionPattern = FULL_ATTENTION,
) -> PackedBatch:
    """The packed layout of n rows (left-padded prompts, right-padded completions); rows with the
    same `groups` id share a prompt (`prompt_groups`) and are packed together; rows that do not are
    refused, as each would be computed after the other's prompt. `attention`: the model's layer
    kinds and spans, which the mask reproduces (`attention_pattern`).

    >>> batch = pack(torch.tensor([[0, 5], [0, 5]]), torch.tensor([[0, 1], [0, 1]]),
    ...              torch.tensor([[6, 7], [8, 0]]), torch.tensor([[1, 1], [1, 0]]), torch.tensor([0, 0]),
    ...              torch.float32)
    >>> batch.input_ids.tolist(), batch.position_ids.tolist()
    ([[5, 6, 7, 8]], [[0, 1, 2, 1]])
    >>> (batch.attention_mask[0, 0] == 0).int().tolist()  # 8 sees the prompt and itself, not 6 or 7
    [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 1]]
    >>> batch.source_position.tolist()  # 6 and 8 from the prompt's last token, 7 from 6
    [[0, 1], [0, 0]]
    """
    rows = _packed_rows(prompt_mask, completion_mask, groups)
    shared = rows.first[rows.slot]  # each row's group's first row, whose prompt the packed row holds
    masked = prompt_ids * prompt_mask
    if not (torch.equal(prompt_mask, prompt_mask[shared]) and torch.equal(masked, masked[shared])):
        raise ValueError("rows packed as one group have different prompts: group them with prompt_groups")
    k, t = rows.slot_prompt.numel(), int(rows.size.max())
    input_ids = torch.zeros(k, t, dtype=prompt_ids.dtype, device=prompt_ids.device)
    position_ids = torch.zeros(k, t, dtype=torch.long, device=prompt_ids.device)
    seg = torch.full((k, t), -2, dtype=torch.long, device=prompt_ids.device)  # -2 padding, -1 prompt, else the row
    _place_prompts(prompt_ids, rows, input_ids, position_ids, seg)
    source_position = _place_completions(completion_ids, prompt_mask.sum(-1), rows, input_ids, position_ids, seg)
    source_row = rows.slot.unsqueeze(1).expand_as(completion_ids)
    return PackedBatch(
        input_ids, position_ids, _attention_masks(seg, position_ids, dtype, attention), source_row, source_position
    )


@dataclass
class _PackedRows:
    """Where each group and completion goes: one packed row per group, completions in row order."""

    slot: torch.Tensor  # [n] the packed row of each completion
    first: torch.Tensor  # [k] a row of each group: its prompt is the group's
    slot_prompt: torch.Tensor  # [k] each packed row's prompt length
    completion_len: torch.Tensor  # [n]
    start: torch.Tensor  # [n] where each completion starts in its packed row
    size: torch.Tensor  # [k] each packed row's length


def _packed_rows(prompt_mask: torch.Tensor, completion_mask: torch.Tensor, groups: torch.Tensor) -> _PackedRows:
    """Each completion's packed row (one per group id, in sorted order) and where it starts there."""
    device = completion_mask.device
    n = completion_mask.size(0)
    prompt_len, completion_len = prompt_mask.sum(-1), completion_mask.sum(-1)
    _, slot = torch.unique(groups, return_inverse=True)
    k = int(slot.max()) + 1
    first = torch.full((k,), n, dtype=torch.long, device=device).scatter_reduce_(
        0, slot, torch.arange(n, device=device), reduce="amin"
    )
    slot_prompt = prompt_len[first]
    # Completions follow their prompt in row order: start = prompt length + the lengths before it in its group.
    order = torch.argsort(slot, stable=True)
    lengths_sorted = completion_len[order]
    before = lengths_sorted.cumsum(0) - lengths_sorted
    group_start = torch.zeros(k, dtype=torch.long, device=device).scatter_reduce_(
        0, slot[order], before, reduce="amin", include_self=False
    )
    start = torch.empty(n, dtype=torch.long, device=device)
    start[order] = slot_prompt[slot[order]] + before - group_start[slot[order]]
    size = slot_prompt + torch.zeros(k, dtype=torch.long, device=device).index_add_(0, slot, completion_len)
    return _PackedRows(slot, first, slot_prompt, completion_len, start, size)


def _place_prompts(
    prompt_ids: torch.Tensor,
    rows: _PackedRows,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    seg: torch.Tensor,
) -> None:
    """Each group's prompt at the start of its packed row: position j of slot s holds
    prompt_ids[first[s], p - len + j] (the prompts are left-padded)."""
    k, p = rows.slot_prompt.numel(), prompt_ids.size(1)
    j = torch.arange(p, device=prompt_ids.device).expand(k, p)
    in_prompt = j < rows.slot_prompt.unsqueeze(1)
    src = (p - rows.slot_prompt.unsqueeze(1) + j).clamp(max=p - 1)
    slots = torch.arange(k, device=prompt_ids.device).unsqueeze(1).expand(k, p)
    input_ids[slots[in_prompt], j[in_prompt]] = prompt_ids[rows.first.unsqueeze(1).expand(k, p), src][in_prompt]
    position_ids[slots[in_prompt], j[in_prompt]] = j[in_prompt]
    seg[slots[in_prompt], j[in_prompt]] = -1


def _place_completions(
    completion_ids: torch.Tensor,
    prompt_len: torch.Tensor,
    rows: _PackedRows,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    seg: torch.Tensor,
) -> torch.Tensor:
    """Token j of row r at start[r] + j of its slot, its position id counting on from its own
    prompt; returns [n, C] the position whose logits predict each token."""
    device = completion_ids.device
    n, c = completion_ids.shape
    j = torch.arange(c, device=device).expand(n, c)
    real = j < rows.completion_len.unsqueeze(1)
    row = torch.arange(n, device=device).unsqueeze(1).expand(n, c)
    where = (rows.start.unsqueeze(1) + j)[real]
    slot = rows.slot.unsqueeze(1).expand(n, c)[real]
    input_ids[slot, where] = completion_ids[real]
    position_ids[slot, where] = (prompt_len.unsqueeze(1) + j)[real]
    seg[slot, where] = row[real]
    # token j is predicted at position j - 1 of its completion, token 0 at the prompt's last position
    source_position = torch.where(j == 0, rows.slot_prompt[rows.slot].unsqueeze(1) - 1, rows.start.unsqueeze(1) + j - 1)
    return torch.where(real, source_position, torch.zeros_like(source_position))


def _attention_masks(
    seg: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype, attention: AttentionPattern
) -> torch.Tensor | dict[str, torch.Tensor]:
    """The mask of every layer kind in `attention`: one [K, 1, T, T] tensor when the layers attend
    alike, else a dict by kind (token-wise layers, which read no mask, get the full one)."""
    kinds = sorted({kind if kind in MASKED_KINDS else "full_attention" for kind in attention.kinds})
    masks = {kind: _attention_mask(seg, positions, dtype, kind, attention) for kind in kinds}
    if len(masks) == 1:
        return next(iter(masks.values()))
    for kind in set(attention.kinds) - set(masks):
        masks[kind] = masks["full_attention"] if "full_attention" in masks else next(iter(masks.values()))
    return masks


def _attention_mask(
    seg: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype, kind: str, attention: AttentionPattern
) -> torch.Tensor:
    """[K, 1, T, T] additive: a query sees earlier prompt tokens and its own completion's, nothing of
    its siblings' and no padding; within the sliding window or the chunk its layer kind has, counted
    in positions as the padded rows count them."""
    k, t = seg.shape
    q, kv = seg.unsqueeze(2), seg.unsqueeze(1)
    causal = torch.ones(t, t, dtype=torch.bool, device=seg.device).tril()
    allowed = causal & (kv != -2) & ((kv == -1) | (kv == q))
    q_pos, kv_pos = positions.unsqueeze(2), positions.unsqueeze(1)
    if kind == "sliding_attention" and attention.sliding_window is not None:
        allowed &= q_pos - kv_pos < attention.sliding_window  # transformers' sliding_window_overlay
    if kind == "chunked_attention" and attention.chunk_size is not None:
        allowed &= q_pos // attention.chunk_size == kv_pos // attention.chunk_size  # its chunked_overlay
    allowed |= torch.eye(t, dtype=torch.bool, device=seg.device)  # a padding query looks at itself: no row of -inf only
    return torch.zeros(k, 1, t, t, dtype=dtype, device=seg.device).masked_fill_(
        ~allowed.unsqueeze(1), torch.finfo(dtype).min
    )


def token_counts(prompt_mask: torch.Tensor, completion_mask: torch.Tensor, groups: torch.Tensor) -> tuple[int, int]:
    """(tokens a padded pass computes, tokens a packed pass computes) for these rows."""
    n = completion_mask.size(0)
    padded = n * (prompt_mask.size(1) + completion_mask.size(1))
    prompt_len, completion_len = prompt_mask.sum(-1).tolist(), completion_mask.sum(-1).tolist()
    first: dict[int, int] = {}
    packed = 0
    for row, group in enumerate(groups.tolist()):
        if group not in first:
            first[group] = row
            packed += prompt_len[row]
        packed += completion_len[row]
    return padded, packed


def choose_layout(
    layout: str,
    prompt_mask: torch.Tensor,
    completion_mask: torch.Tensor,
    groups: torch.Tensor,
    hidden_size: int,
) -> str:
    """`packed` or `padded` for a micro-batch. `auto` packs when the estimated cost of a pass is
    lower packed: per layer a token costs ~24·h² FLOPs in its projections and MLP and a pair of
    tokens that attend ~4·h, so cost ≈ 24·h²·tokens + 4·h·Σ(row length)²."""
    if layout != "auto":
        return layout
    n = completion_mask.size(0)
    padded_tokens, packed_tokens = token_counts(prompt_mask, completion_mask, groups)
    rows = len(set(groups.tolist()))
    padded_cost = 24 * hidden_size * padded_tokens + 4 * n * (padded_tokens / n) ** 2
    packed_cost = 24 * hidden_size * packed_tokens + 4 * rows * (packed_tokens / rows) ** 2
    return "packed" if packed_cost < padded_cost else "padded"
