"""A decode step of fixed shape for plain decoders: a preallocated KV cache, every row decoded every
step, a layer in a third of the operations of the model's own forward.

Why: on a CPU, decoding one token for a handful of rows is bound by reading the weights, and the
model's own forward spends as much again beside its multiplies. Measured on SmolLM2-135M, 16 rows,
2 threads of the AMX Xeon: 76.5 ms a step at fp32 (multiplies 55 ms, the dynamic cache's
concatenations 13.5 ms, which copy the whole cache every token) and 49 ms on the bf16 copy
(multiplies 27.5 ms; concatenations, attention, RMSNorm's casts and rotary's slices the rest).
Here the cache is written in place at the step's column, attention reads a view of the columns
so far, and a layer is RMSNorm, the projections, rotary, two cache writes, attention and the MLP:
about 20 operations where the forward launches 45.

Rows that finished stay in the batch (their tokens are pads and are discarded), so every step has
the same shape. Only decoders whose layers are exactly this (`unsupported` names the families and
checks each module) take this path, and `probe` checks its logits against a fresh forward before a
run trusts it; every other model decodes through its own forward (rollout.fast).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from grpo_cli.rollout.forward_steps import prefill

# model_types whose decoder layer is RMSNorm -> q/k/v (bias optional) -> optional per-head q/k RMSNorm
# -> rotary -> attention -> o -> residual -> RMSNorm -> gate/up/act/down -> residual, with no other term
FAMILIES = ("llama", "qwen2", "qwen3", "mistral")


def unsupported(model: torch.nn.Module) -> str | None:
    """Why this model cannot take the fixed-shape decode, or None."""
    if hasattr(model, "peft_config"):  # its adapters wrap the projections: the step would skip their delta
        return "a PEFT model: its adapted projections are not plain linear layers"
    config = model.config
    if config.model_type not in FAMILIES:
        return f"its family ({config.model_type}) is not one of {', '.join(FAMILIES)}"
    if getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True):
        return "it has a sliding window"
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None or getattr(inner, "rotary_emb", None) is None:
        return "its decoder has no layers and rotary module where a Llama's are"
    for layer in layers:
        attention, mlp = layer.self_attn, layer.mlp
        projections = [getattr(attention, name, None) for name in ("q_proj", "k_proj", "v_proj", "o_proj")]
        projections += [getattr(mlp, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
        # exactly nn.Linear: a LoRA or quantized layer keeps a `weight` this path would multiply without its delta
        if not all(type(module) is torch.nn.Linear for module in projections) or not hasattr(mlp, "act_fn"):
            return "its projections are not plain linear layers (LoRA, quantized, or another layout)"
    if type(model.lm_head) is not torch.nn.Linear:
        return "its output layer is not a plain linear layer"
    return None


def rotate(states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding in the half-split layout Llama's checkpoints use."""
    half = states.size(-1) // 2
    turned = torch.cat((-states[..., half:], states[..., :half]), dim=-1)
    return states * cos + turned * sin


class FixedShapeDecoder:
    """The decode steps of one generate call: `start` takes the prefill's cache into preallocated
    buffers, `step` decodes one token for every row, `release` frees the buffers (the sampler calls
    it after each rollout, so the cache is not held through the update).

    The residual stream, the norms, rotary, the cache and attention are float32 whatever the
    weights' dtype; on the bf16 copy the multiplies read bf16 and give bf16 (projections, the MLP),
    which RMSNorm and softmax then take as float32 without the casts the model's forward makes at
    every layer."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.inner = model.model
        config = model.config
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.scale = float(model.model.layers[0].self_attn.scaling)
        self.dtype = model.lm_head.weight.dtype
        self.keys: list[torch.Tensor] = []  # per layer [rows, kv heads, head_dim, capacity]: a column per token
        self.values: list[torch.Tensor] = []  # per layer [rows, kv heads, capacity, head_dim]
        self.norms: dict[int, tuple[torch.Tensor, float]] = {}
        self.length = 0  # the columns written so far

    def start(self, cache: Any, rows: torch.Tensor, capacity: int) -> None:
        """Copies the prefill's cache, row `rows[i]` into row i, into buffers of `capacity` columns,
        and the norms' weights as float32 (the weights may have changed since the last call)."""
        first = cache.layers[0].keys
        key_shape = (rows.numel(), self.kv_heads, self.head_dim, capacity)
        if not self.keys or self.keys[0].shape != key_shape:
            self.keys = [first.new_empty(key_shape, dtype=torch.float32) for _ in cache.layers]
            value_shape = (rows.numel(), self.kv_heads, capacity, self.head_dim)
            self.values = [first.new_empty(value_shape, dtype=torch.float32) for _ in cache.layers]
        self.length = first.size(2)
        for layer, key, value in zip(cache.layers, self.keys, self.values, strict=True):
            key[..., : self.length] = layer.keys[rows].transpose(2, 3)
            value[:, :, : self.length] = layer.values[rows]
        self.norms = {
            id(module): (module.weight.float(), module.variance_epsilon)
            for module in self.model.modules()
            if hasattr(module, "variance_epsilon")
        }

    def release(self) -> None:
        """Frees the cache buffers (the next `start` allocates them again)."""
        self.keys, self.values, self.norms = [], [], {}

    def norm(self, module: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        weight, eps = self.norms[id(module)]
        return F.rms_norm(hidden, (hidden.size(-1),), weight, eps)

    def linear(self, module: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden.to(self.dtype), module.weight, module.bias)

    @torch.no_grad()
    def step(self, token: torch.Tensor, position: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """The float32 logits [rows, V] after `token` [rows] at `position` [rows, 1]; `bias` [rows, 1,
        1, columns + 1] is 0 where a row attends and -inf over its prompt's padding."""
        hidden = self.inner.embed_tokens(token).float()  # [rows, H]
        cos, sin = self.inner.rotary_emb(hidden, position)
        cos, sin = cos.view(-1, 1, self.head_dim).float(), sin.view(-1, 1, self.head_dim).float()
        column = self.length
        for layer, key_cache, value_cache in zip(self.inner.layers, self.keys, self.values, strict=True):
            normed = self.norm(layer.input_layernorm, hidden)
            hidden = hidden + self.attend(layer.self_attn, normed, cos, sin, key_cache, value_cache, column, bias)
            mlp = layer.mlp
            normed = self.norm(layer.post_attention_layernorm, hidden).to(self.dtype)
            inner = mlp.act_fn(self.linear(mlp.gate_proj, normed)) * self.linear(mlp.up_proj, normed)
            hidden = hidden + self.linear(mlp.down_proj, inner)
        self.length = column + 1
        return self.linear(self.model.lm_head, self.norm(self.inner.norm, hidden)).float()

    def attend(
        self,
        attention: torch.nn.Module,
        normed: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        column: int,
        bias: torch.Tensor,
    ) -> torch.Tensor:
        """One layer's attention output for the new token: its key and value written at `column`,
        its query against the columns so far (each key/value head serves its group of query heads)."""
        rows = normed.size(0)
        normed = normed.to(self.dtype)
        query = self.linear(attention.q_proj, normed).float().view(rows, self.heads, self.head_dim)
        key = self.linear(attention.k_proj, normed).float().view(rows, self.kv_heads, self.head_dim)
        if hasattr(attention, "q_norm"):  # Qwen3: per-head RMSNorm before rotary
            query, key = self.norm(attention.q_norm, query), self.norm(attention.k_norm, key)
        key_cache[..., column] = rotate(key, cos, sin)
        value_cache[:, :, column] = self.linear(attention.v_proj, normed).view(rows, self.kv_heads, self.head_dim)
        # grouped query heads against their key/value head: [rows, kv, group, d] x [rows, kv, d, columns]
        query = rotate(query, cos, sin).view(rows, self.kv_heads, self.heads // self.kv_heads, self.head_dim)
        scores = torch.matmul(query, key_cache[..., : column + 1]) * self.scale + bias
        out = torch.matmul(scores.softmax(-1), value_cache[:, :, : column + 1])  # [rows, kv, group, d]
        return self.linear(attention.o_proj, out.view(rows, self.heads * self.head_dim))


def padding_bias(prompt_mask: torch.Tensor, capacity: int) -> torch.Tensor:
    """[rows, 1, 1, capacity] float32: -inf over each row's prompt padding, 0 everywhere after it."""
    bias = prompt_mask.new_zeros((prompt_mask.size(0), 1, 1, capacity), dtype=torch.float32)
    bias[:, 0, 0, : prompt_mask.size(1)].masked_fill_(prompt_mask == 0, -math.inf)
    return bias


@torch.no_grad()
def probe(model: torch.nn.Module, tolerance: float) -> str | None:
    """Why the fixed-shape decode does not reproduce this model, or None: two left-padded prompts
    prefilled by the model's forward, each row repeated, three tokens decoded here, against a fresh
    forward over the same sequences. Cheap enough for every start, and it decides by what the path
    does: a layer whose forward has a term `step` lacks shows up as a gap in the logits."""
    reason = unsupported(model)
    if reason is not None:
        return reason
    parameter = next(model.parameters())
    vocab = model.get_input_embeddings().num_embeddings
    prompts = (torch.arange(10, device=parameter.device).view(2, 5) * 7 + 3) % vocab
    prompt_mask = torch.ones_like(prompts)
    prompt_mask[1, :2] = 0
    rows = torch.tensor([0, 0, 1, 1], device=prompts.device)
    tokens = (torch.arange(12, device=prompts.device).view(4, 3) * 11 + 5) % vocab
    try:
        decoded, fresh = _probe_logits(model, prompts, prompt_mask, tokens, rows)
    except Exception as err:  # a forward or cache unlike a Llama's that the checks above could not tell
        return f"its fixed-shape decode fails on a probe ({type(err).__name__}: {str(err)[:160]})"
    gap = float((decoded - fresh).abs().max() / fresh.abs().max().clamp(min=1e-6))
    if not gap <= tolerance:  # `not <=`: a NaN gap fails too
        return f"its fixed-shape decode gives logits {gap:.0e} away from a fresh forward's"
    return None


def _probe_logits(
    model: torch.nn.Module, prompts: torch.Tensor, prompt_mask: torch.Tensor, tokens: torch.Tensor, rows: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`probe`'s two sets of logits [rows, steps, V]: decoded here after the model's own prefill,
    and a fresh forward's over the same sequences."""
    cache, _, position = prefill(model, prompts, prompt_mask)
    steps = tokens.size(1)
    capacity = prompts.size(1) + steps
    decoder = FixedShapeDecoder(model)
    decoder.start(cache, rows, capacity)
    bias = padding_bias(prompt_mask[rows], capacity)
    decoded = [
        decoder.step(tokens[:, step], position[rows] + step, bias[..., : decoder.length + 1]) for step in range(steps)
    ]
    full_mask = torch.cat([prompt_mask[rows], prompt_mask.new_ones(rows.numel(), steps)], dim=1)
    fresh = model(
        input_ids=torch.cat([prompts[rows], tokens], dim=1),
        attention_mask=full_mask,
        position_ids=(full_mask.cumsum(-1) - 1).clamp(min=0),
        use_cache=False,
    ).logits[:, prompts.size(1) :]
    return torch.stack(decoded, dim=1), fresh.float()
