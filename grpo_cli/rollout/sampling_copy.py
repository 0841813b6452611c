"""A bf16 copy of an fp32 policy for sampling only (`rollout.sampling_weights`).

Decoding one token reads every weight of the model once for a handful of rows: the step is bound by
how fast the weights stream from memory, and on a device whose matrix units compute bf16 natively
(CPU AMX / AVX512-BF16, CUDA from Ampere) a bf16 copy halves the bytes and runs the multiplies at the
bf16 rate. SmolLM2-135M on a 2-core AVX512-BF16/AMX CPU, the vs-TRL workload: generation 3.4 s a
step on the fp32 policy, 2.6 s on the copy (docs/benchmarks.md "Floors"). Training keeps the fp32 weights: the copy is
refreshed from them after every update, its log-probs of the sampled tokens go with the rollout as
the engine's (`Rollout.engine_logps`), and `algo.rollout_correction` weighs each token by
pi_policy / pi_copy as it does for vLLM, with `rollout/engine_gap` saying how far apart they are.

Buffers stay fp32 (rotary frequencies in bf16 would move every position), and greedy decoding (the
evaluation) runs the policy itself, so an evaluation score is the trained model's, not the copy's.
"""

from __future__ import annotations

import copy

import torch

from grpo_cli.config.schema import RolloutConfig
from grpo_cli.errors import GrpoError

# below this many parameters a decode step is bound by kernel launches, not weight reads: the copy
# saves nothing (the tiny default: 0.2M parameters) and auto keeps the policy
MIN_PARAMETERS = 20_000_000


def native_bf16(device: torch.device) -> bool:
    """Whether this device multiplies bf16 matrices in hardware: CUDA's own answer, oneDNN's on a CPU
    (AVX512-BF16 or AMX); anything else would emulate bf16 and run slower than fp32."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return False


def sampling_weights_choice(model: torch.nn.Module, cfg: RolloutConfig, loop: str) -> tuple[bool, str]:
    """Whether `grpo train` samples from a bf16 copy of `model`, and the start-up words saying why
    (or why not); `loop` is the loop make_generator picked."""
    parameters = list(model.parameters())
    fp32 = all(p.dtype == torch.float32 for p in parameters)
    return copy_decision(cfg.sampling_weights, loop, fp32, parameters[0].device, sum(p.numel() for p in parameters))


def copy_decision(setting: str, loop: str, fp32: bool, device: torch.device, parameters: int) -> tuple[bool, str]:
    """The rule, for the trainer and the memory plan alike. `bf16` insists where a copy can work at
    all (the fast loop, fp32 weights); `auto` takes it only where it pays: the device computes bf16
    natively and the model is big enough to be bound by its weight reads (MIN_PARAMETERS, checked
    first so a small model's words do not depend on the machine)."""
    if setting == "policy":
        return False, "the policy's weights (rollout.sampling_weights=policy)"
    if loop != "fast":
        reason = "the copy samples in the fast loop only"
    elif not fp32:
        reason = "the policy's weights are not all fp32"
    elif setting == "bf16":
        return True, "a bf16 copy of the policy (rollout.sampling_weights=bf16)"
    elif parameters < MIN_PARAMETERS:
        reason = f"a model under {MIN_PARAMETERS // 1_000_000}M parameters decodes as fast in fp32"
    elif not native_bf16(device):
        reason = f"this {device.type} has no native bf16 matrix multiply"
    else:
        native = f"rollout.sampling_weights=auto: this {device.type} computes bf16 natively"
        return True, f"a bf16 copy of the policy ({native})"
    if setting == "bf16":
        raise GrpoError(f"rollout.sampling_weights=bf16 cannot be used here: {reason}; use auto or policy")
    return False, f"the policy's weights ({reason})"


class SamplingCopy:
    """The policy's parameters cast to `dtype` (bf16; the asynchronous sampler's copy keeps the
    policy's own) in a module of their own; refreshed from the trained parameters only (frozen ones, a
    LoRA run's base, never change)."""

    def __init__(self, policy: torch.nn.Module, dtype: torch.dtype | None = torch.bfloat16) -> None:
        # frozen parameters already in the copy's dtype are shared, not copied: a LoRA run's base at
        # rollout.max_staleness >= 1 would otherwise be held twice (nothing writes it in place)
        frozen = {id(p): p for p in policy.parameters() if not p.requires_grad and dtype in (None, p.dtype)}
        self.module = copy.deepcopy(policy, memo=frozen)
        for parameter in self.module.parameters():
            parameter.requires_grad_(False)
            if dtype is not None:
                parameter.data = parameter.data.to(dtype)
        self.pairs = [
            (mine, theirs)
            for mine, theirs in zip(self.module.parameters(), policy.parameters(), strict=True)
            if theirs.requires_grad
        ]
        self.module.eval()

    @torch.no_grad()
    def refresh(self) -> None:
        for mine, theirs in self.pairs:
            mine.copy_(theirs)

    def bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.module.parameters())
