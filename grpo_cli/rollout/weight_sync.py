"""Keeping a generation engine's copy of the weights in step with the policy being trained.

An engine that holds its own weights (vLLM) samples from a stale policy unless it is told the
optimizer moved them. The trainer says so after every step (`weights_updated`); the weights are
pushed once, just before the next generation, so several optimizer steps between two rollouts cost
one push. What is pushed is what the engine's loader expects from a Hugging Face checkpoint: the
plain model's names, each tensor once (a tied embedding under its first name only), and for a
LoRA policy the merged weights W + B·A·alpha/r, computed beside the module rather than by merging
it in place: an in-place merge and unmerge rounds the frozen base weights (in bf16 visibly), and
the KL reference of a LoRA run is that very base.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass

import torch

from grpo_cli.errors import GrpoError

PEFT_PREFIX = "base_model.model."  # what peft puts before every name of the wrapped model
MODULES_TO_SAVE = re.compile(r"\.modules_to_save\.[^.]+")  # peft's trained copy of a whole module, per adapter

Push = Callable[[Iterable[tuple[str, torch.Tensor]]], None]


def engine_parameter_name(name: str) -> str | None:
    """A policy state-dict name as a Hugging Face checkpoint spells it, or None for a tensor the
    engine has no place for (LoRA factors, peft's frozen original of a module it trains a copy of).

    >>> engine_parameter_name("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight")
    'model.layers.0.self_attn.q_proj.weight'
    >>> engine_parameter_name("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight") is None
    True
    >>> engine_parameter_name("model.norm.weight")
    'model.norm.weight'
    """
    name = name.removeprefix(PEFT_PREFIX)
    parts = name.split(".")
    if "original_module" in parts or any(part.startswith("lora_") for part in parts):
        return None
    return MODULES_TO_SAVE.sub("", name.replace(".base_layer.", "."))


def lora_layers(policy: torch.nn.Module) -> dict[str, tuple[torch.nn.Module, str]]:
    """{state-dict name of a base weight or bias: (its LoRA layer, "weight" | "bias")} for every
    peft LoRA layer (duck-typed: a base layer and `get_delta_weight`); empty for a plain model."""
    found: dict[str, tuple[torch.nn.Module, str]] = {}
    for name, module in policy.named_modules():
        if callable(getattr(module, "get_delta_weight", None)) and hasattr(module, "base_layer"):
            found[f"{name}.base_layer.weight"] = (module, "weight")
            found[f"{name}.base_layer.bias"] = (module, "bias")
    return found


def unmerged_adapters(layer: torch.nn.Module) -> list[str]:
    """The adapters whose update the layer's forward adds but its base weight does not hold yet."""
    if getattr(layer, "disable_adapters", False):
        return []
    merged = set(getattr(layer, "merged_adapters", ()))
    known = set(getattr(layer, "lora_A", {})) | set(getattr(layer, "lora_embedding_A", {}))
    adapters = [a for a in getattr(layer, "active_adapters", ()) if a in known and a not in merged]
    for adapter in adapters:
        if adapter in getattr(layer, "lora_variant", {}) or getattr(layer, "use_dora", {}).get(adapter):
            raise GrpoError("rollout.backend=vllm pushes plain LoRA updates (B·A·alpha/r); DoRA-style variants are not")
    return adapters


def merged_value(layer: torch.nn.Module, kind: str, base: torch.Tensor) -> torch.Tensor:
    """The base weight (or bias) plus the layer's unmerged LoRA updates, as peft's merge would
    compute them, without writing to the layer."""
    value = base
    for adapter in unmerged_adapters(layer):
        if kind == "weight":
            delta = layer.get_delta_weight(adapter)
        elif getattr(layer, "lora_bias", {}).get(adapter):
            delta = layer.lora_B[adapter].bias * layer.scaling[adapter]
        else:
            continue
        value = value + delta.to(base.dtype)
    return value


@torch.no_grad()
def engine_weights(policy: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(checkpoint name, tensor) for every weight of the policy, LoRA updates merged in; one at a
    time, so a merged weight exists only while the engine copies it."""
    layers = lora_layers(policy)
    seen: set[int] = set()
    for name, tensor in policy.state_dict(keep_vars=True).items():
        if id(tensor) in seen:  # a tied weight (lm_head = embed_tokens): the engine ties it itself
            continue
        seen.add(id(tensor))
        engine_name = engine_parameter_name(name)
        if engine_name is None:
            continue
        value = tensor.detach()
        if name in layers:
            value = merged_value(*layers[name], value)
        yield engine_name, value


@dataclass
class SyncStats:
    pushes: int = 0  # times the weights went to the engine
    tensors: int = 0  # tensors pushed, all pushes together
    bytes: int = 0  # their size in the policy's dtype
    seconds: float = 0.0  # time spent pushing
    pushed_version: int = -1  # the policy version the engine holds (-1: what it loaded from disk)


class PolicyWeightSync:
    """Counts policy versions and pushes the current one before a generation that needs it.

    Starts stale: the engine loaded its weights from the model directory, which need not be the
    policy's (a resumed run, a LoRA adapter), so the first generation always pushes once.
    """

    def __init__(self, policy: torch.nn.Module, push: Push) -> None:
        self.policy = policy
        self.push = push
        self.version = 0
        self.stats = SyncStats()

    def weights_updated(self) -> None:
        """The optimizer moved the weights: the engine's copy is stale from now on."""
        self.version += 1

    @property
    def stale(self) -> bool:
        return self.stats.pushed_version != self.version

    def sync(self) -> bool:
        """Push the weights when the engine's copy is stale; whether it pushed."""
        if not self.stale:
            return False
        start = time.perf_counter()
        self.push(self._counted(engine_weights(self.policy)))
        self.stats.seconds += time.perf_counter() - start
        self.stats.pushes += 1
        self.stats.pushed_version = self.version
        return True

    def _counted(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in weights:
            self.stats.tensors += 1
            self.stats.bytes += tensor.numel() * tensor.element_size()
            yield name, tensor

    def summary(self) -> dict[str, float | int]:
        return asdict(self.stats)

    def describe(self) -> str:
        s = self.stats
        return (
            f"weight sync: {s.pushes} pushes (policy version {s.pushed_version}), {s.tensors} tensors, "
            f"{s.bytes / 2**20:.1f} MiB in {s.seconds:.2f} s"
        )
