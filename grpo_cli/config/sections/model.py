"""`model.*`: which policy to load or build, and its LoRA adapters."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TinyModelConfig:
    """Size of the random-init Llama built in code for tests, smoke runs and the default."""

    hidden_size: int = 64  # embedding width
    num_layers: int = 2  # transformer blocks
    num_heads: int = 4  # attention heads (also the KV heads)
    intermediate_size: int = 128  # MLP width
    max_position_embeddings: int = 256  # longest prompt + completion, in tokens


@dataclass
class LoraConfig:
    """`model.lora`: train low-rank adapters (peft) instead of every weight; with algo.beta > 0 the KL
    reference is the base model with the adapters switched off, so no second copy of the weights."""

    enabled: bool = False  # true: train only the adapters
    r: int = 16  # rank of each adapter's A (r x in) and B (out x r)
    alpha: float = 32.0  # the update B·A is scaled by alpha / r
    dropout: float = 0.05  # dropout on the adapter's input, in [0, 1)
    # modules that get adapters: [all-linear] = every linear layer but the output head (PEFT's all-linear,
    # verl's default): attention, linear-attention and Mamba projections, MLPs, whatever a family names
    # them; routed experts (3-D weights) and routers stay frozen. Or names, peft-matched (q_proj matches
    # every *.q_proj), e.g. [q_proj, k_proj, v_proj, o_proj], which may be mixed with all-linear
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])


@dataclass
class ModelConfig:
    kind: str = "tiny"  # tiny | hf
    path: str | None = None  # hf: a local directory, a .gguf file or a hub id; tiny: refused (built in the run dir)
    gguf_file: str | None = None  # a GGUF file inside model.path (a directory) or inside model.package
    package: str | None = None  # an installed Python package that ships the model file (model=smollm2_135m)
    cache_dir: str = "~/.cache/grpo/models"  # where a GGUF file is converted, once, to a Hugging Face directory
    dtype: str = "auto"  # auto | fp32 | bf16 | fp16: weights dtype when loading
    trust_remote_code: bool = False  # run a hub model's own modelling code (transformers' trust_remote_code)
    gradient_checkpointing: bool = False  # recompute activations in backward: less memory, about a third more compute
    lm_head_fp32: bool = False  # the output projection (so the logits) in fp32 in a bf16/fp16 run (ScaleRL)
    # every dropout of the policy at p = 0, LoRA's adapters included (model.lora.dropout then does nothing);
    # TRL's disable_dropout. True where TRL's is false: rollouts sample the model in eval mode, without
    # dropout, and the update scores those tokens in train mode, so with dropout on, the ratio and the KL
    # (whose reference always runs in eval mode) compare another, randomly thinned policy. Most LLM
    # checkpoints have no dropout, so nothing changes for them
    disable_dropout: bool = True
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
