"""Padding-free training passes: each prompt once, followed by its completions, in one row per group.

The padded layout computes every row as left-padded prompt + right-padded completion, so a group's
prompt is computed G times and every completion is as long as the longest one. Packed, a group is
one row `prompt | completion_1 | ... | completion_k` of real tokens only; a 4-D attention mask lets
each completion see its prompt and its own earlier tokens (nothing of its siblings), and position
ids restart after the prompt for every completion, so each token sees exactly what it saw in the
padded layout. Logits are gathered back into the padded [rows, C] shape the loss uses.

Attention inside a packed row grows with the square of its length, so `choose_layout` keeps the
padded layout where that would cost more than the tokens saved (DESIGN.md §3, "Training passes").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PackedBatch:
    """A micro-batch in the packed layout, and where each completion token's logits come from."""

    input_ids: torch.Tensor  # [K, T], K groups (distinct prompts) in the micro-batch
    position_ids: torch.Tensor  # [K, T]
    attention_mask: torch.Tensor  # [K, 1, T, T] additive: 0 where a query may look, dtype min elsewhere
    source_row: torch.Tensor  # [n, C]: the packed row whose logits predict completion token (r, j)
    source_position: torch.Tensor  # [n, C]: ... and the position in it


def _lengths(mask: torch.Tensor) -> list[int]:
    return mask.sum(-1).tolist()


def pack(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    groups: torch.Tensor,
    dtype: torch.dtype,
) -> PackedBatch:
    """The packed layout of n rows (left-padded prompts, right-padded completions); rows with the
    same `groups` id share a prompt (their prompt rows are identical) and are packed together.

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
    device = completion_ids.device
    n, c = completion_ids.shape
    p = prompt_ids.size(1)
    prompt_len, completion_len = _lengths(prompt_mask), _lengths(completion_mask)
    order: dict[int, list[int]] = {}
    for row, group in enumerate(groups.tolist()):
        order.setdefault(group, []).append(row)
    members = list(order.values())
    sizes = [prompt_len[rows[0]] + sum(completion_len[r] for r in rows) for rows in members]
    k, t = len(members), max(sizes)
    # Where each packed position's token comes from: (row, column) of prompt_ids or completion_ids.
    dst_k, dst_t, src_row, src_col, is_prompt, position, segment = [], [], [], [], [], [], []
    source_row = torch.zeros(n, c, dtype=torch.long)
    source_position = torch.zeros(n, c, dtype=torch.long)
    for slot, rows in enumerate(members):
        length = prompt_len[rows[0]]
        for j in range(length):
            dst_k.append(slot), dst_t.append(j), src_row.append(rows[0]), src_col.append(p - length + j)
            is_prompt.append(True), position.append(j), segment.append(-1)
        offset = length
        for row in rows:
            span = completion_len[row]
            for j in range(span):
                dst_k.append(slot), dst_t.append(offset + j), src_row.append(row), src_col.append(j)
                is_prompt.append(False), position.append(length + j), segment.append(row)
            source_row[row] = slot
            if span:  # token j is predicted at position j - 1 of the completion, token 0 at the prompt's end
                source_position[row, 0] = length - 1
                source_position[row, 1:span] = torch.arange(offset, offset + span - 1)
            offset += span
    dst = (torch.tensor(dst_k), torch.tensor(dst_t))
    src_row_t, src_col_t, prompt_part = torch.tensor(src_row), torch.tensor(src_col), torch.tensor(is_prompt)
    tokens = torch.where(
        prompt_part,
        prompt_ids[src_row_t, src_col_t.clamp(max=p - 1)],
        completion_ids[src_row_t, src_col_t.clamp(max=c - 1)],
    )
    input_ids = torch.zeros(k, t, dtype=prompt_ids.dtype, device=device)
    input_ids[dst] = tokens
    position_ids = torch.zeros(k, t, dtype=torch.long)
    position_ids[dst] = torch.tensor(position)
    seg = torch.full((k, t), -2)  # -2 padding, -1 prompt, else the completion's row
    seg[dst] = torch.tensor(segment)
    q, kv = seg.unsqueeze(2), seg.unsqueeze(1)
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    allowed = causal & (kv != -2) & ((kv == -1) | (kv == q))
    allowed |= torch.eye(t, dtype=torch.bool)  # a padding query looks at itself: no row of -inf only
    mask = torch.zeros(k, 1, t, t, dtype=dtype).masked_fill_(~allowed.unsqueeze(1), torch.finfo(dtype).min)
    return PackedBatch(
        input_ids,
        position_ids.to(device),
        mask.to(device),
        source_row.to(device),
        source_position.to(device),
    )


def token_counts(prompt_mask: torch.Tensor, completion_mask: torch.Tensor, groups: torch.Tensor) -> tuple[int, int]:
    """(tokens a padded pass computes, tokens a packed pass computes) for these rows."""
    n = completion_mask.size(0)
    padded = n * (prompt_mask.size(1) + completion_mask.size(1))
    prompt_len, completion_len = _lengths(prompt_mask), _lengths(completion_mask)
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
