"""`distributed.strategy=fsdp`: the update on a copy of the policy sharded with torch's FSDP2
(`fully_shard` per decoder layer and at the root), called here directly because accelerate's FSDP
plugin never engages on a CPU. Each process holds 1/N of the trained weights, their gradients and
AdamW's two moments.

Sampling needs whole weights (the fast loop, `generate` and a vLLM push all run the model
unsharded, and each process samples its own completions, a different number of forward passes, so
the layer-by-layer all-gathers of a sharded forward would not line up across processes). The
policy module the trainer holds therefore stays whole and serves sampling, checkpoints and the
LoRA reference; after each update `gather_into` writes the sharded copy's trained weights back into
it, one parameter at a time. That whole copy costs the parameters' bytes once per process (no
gradients, no optimizer state). A reference model of its own (algo.beta > 0, no LoRA) is sharded
in place: its forward passes come in the same number on every process, as the update's do.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from typing import Any

import torch

from grpo_cli.config.schema import DistributedConfig, PrecisionConfig
from grpo_cli.core.precision import PRECISION_DTYPES
from grpo_cli.errors import GrpoError

log = logging.getLogger("grpo")


def sharded_run(distributed: DistributedConfig, processes: int) -> bool:
    """Whether this run's update is sharded: distributed.strategy=fsdp over more than one process
    (on one there is nothing to shard, and the run trains as ddp's one process does)."""
    return distributed.strategy == "fsdp" and processes > 1


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks FSDP shards one by one: the classes transformers names in `_no_split_modules`
    (LlamaDecoderLayer, Qwen2DecoderLayer, ...), found in the model (or a peft model's base)."""
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    names = set(getattr(base, "_no_split_modules", None) or ())
    layers = [module for module in model.modules() if type(module).__name__ in names]
    if not layers:
        raise GrpoError(
            f"distributed.strategy=fsdp shards a model block by block and found no blocks in "
            f"{type(base).__name__} (its _no_split_modules is {sorted(names) or 'empty'}); use distributed.strategy=ddp"
        )
    return layers


def mixed_precision(precision: PrecisionConfig) -> Any:
    """FSDP2's policy for the `precision` group: under autocast to bf16 or fp16, each gathered
    block computes in that dtype from the fp32 master shards, and gradients reduce in fp32; else
    the weights' own dtype throughout."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if not precision.autocast or precision.dtype == "fp32":
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=PRECISION_DTYPES[precision.dtype], reduce_dtype=torch.float32)


def shard(
    model: torch.nn.Module, device: torch.device, cfg: DistributedConfig, precision: PrecisionConfig, copy_first: bool
) -> torch.nn.Module:
    """`model` (or a copy of it) sharded over every process: each decoder layer, then the root (the
    embedding, the final norm and the LM head, tied or not)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    sharded = copy.deepcopy(model) if copy_first else model
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    # parameters and optimizer state in host memory between uses: a GPU's saving; on a CPU they are there
    offload = CPUOffloadPolicy() if cfg.cpu_offload and device.type != "cpu" else OffloadPolicy()
    options = {
        "mesh": mesh,
        "reshard_after_forward": cfg.reshard_after_forward,
        "mp_policy": mixed_precision(precision),
        "offload_policy": offload,
    }
    for layer in decoder_layers(sharded):
        fully_shard(layer, **options)
    fully_shard(sharded, **options)
    return sharded


def trained_pairs(sharded: torch.nn.Module, whole: torch.nn.Module) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(sharded parameter, whole parameter) for every trained parameter, by name: the copy keeps the
    module tree, so the names are the same."""
    whole_params = dict(whole.named_parameters())
    for name, parameter in sharded.named_parameters():
        if parameter.requires_grad:
            yield parameter, whole_params[name]


@torch.no_grad()
def gather_into(sharded: torch.nn.Module, whole: torch.nn.Module) -> None:
    """Write the sharded copy's trained weights into the whole module (an all-gather per
    parameter, the same calls in every process)."""
    for shard, target in trained_pairs(sharded, whole):
        target.copy_(shard.full_tensor())


def local_bytes(tensors: Iterator[Any]) -> int:
    """Bytes this process holds of these tensors: a DTensor's local shard only."""
    total = 0
    for tensor in tensors:
        if not isinstance(tensor, torch.Tensor):
            continue
        local = tensor.to_local() if callable(getattr(tensor, "to_local", None)) else tensor
        total += local.numel() * local.element_size()
    return total


def training_state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """This process's tensor bytes of the trained parameters, their gradients and the optimizer
    state: what sharding divides by the number of processes (not RSS)."""
    trained = [p for p in model.parameters() if p.requires_grad]
    state = [value for per_param in optimizer.state.values() for value in per_param.values()]
    parameters = local_bytes(iter(trained))
    return {
        "parameters": parameters,
        "gradients": parameters,  # each gradient has its parameter's shape and sharding (freed between steps)
        "optimizer": local_bytes(v for v in state if isinstance(v, torch.Tensor) and v.dim() > 0),
    }


FULL_OPTIMIZER = "fqn"  # training_state["optimizer_format"]: a full state keyed by parameter name (any process count)


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's whole state, every shard gathered, keyed by parameter name, on the CPU: a
    collective, so every process calls it (the main one then writes it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Each process takes its shard of a `full_optimizer_state` (or all of it, unsharded): so a
    sharded checkpoint resumes on another number of processes, or on one."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


def log_training_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, strategy: str, processes: int, sharded: bool
) -> None:
    """This process's tensor bytes of trained weights, gradients and optimizer state, once the first
    update made the optimizer's: what distributed.strategy=fsdp divides by the number of processes
    (docs/scaling.md). Called on the main process only."""
    held = training_state_bytes(model, optimizer)
    if strategy == "fsdp" and not sharded:
        log.info("distributed.strategy=fsdp on one process: nothing to shard, the run trains unsharded")
    log.info(
        "training state per process (distributed.strategy=%s, %d process(es)): %s MiB in all",
        strategy if processes > 1 else "none",
        processes,
        ", ".join(f"{name} {size / 2**20:.3f} MiB" for name, size in held.items())
        + f"; {sum(held.values()) / 2**20:.3f}",
    )
