"""Load the policy, its tokenizer and (when KL is on) a frozen reference; LoRA adapters via peft.

The tiny model is built from a config with a byte-level tokenizer made in code, then saved and
reloaded through `from_pretrained`, so tests exercise exactly the path a real model takes.
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import SafetensorError, safe_open
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from grpo_cli.checkpoint import COMPLETE_MARKER, base_model_dir, read_trainer_state
from grpo_cli.config.schema import ModelConfig, TinyModelConfig
from grpo_cli.errors import GrpoError
from grpo_cli.lora import add_lora, quiet_peft
from grpo_cli.model_source import model_directory
from grpo_cli.module_mode import evaluating

if TYPE_CHECKING:  # peft costs seconds to import: only runs that use LoRA pay for it
    from peft import PeftModel

TINY_SPECIAL_TOKENS = ("<pad>", "<s>", "</s>")
# A plain-text chat template so conversational prompts also work with the tiny model.
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
ADAPTER_CONFIG = "adapter_config.json"  # peft's: a directory holding it is a LoRA adapter, not full weights


def pick_device(name: str | None) -> torch.device:
    """`auto` (or unset): CUDA when there is one, else the CPU; anything else as torch names it,
    checked here: a device this machine lacks fails in one line, not in a traceback from the first
    tensor moved there."""
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise GrpoError(f"device {name!r}: not a device name (auto, cpu, cuda, cuda:N)") from None
    cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device.type == "cuda" and cuda_count == 0:
        build = "this torch is a CPU build" if torch.version.cuda is None else "torch sees no CUDA device"
        raise GrpoError(f"device {name!r}: {build}; use auto or cpu")
    if device.type == "cuda" and device.index is not None and device.index >= cuda_count:
        raise GrpoError(
            f"device {name!r}: this machine has {cuda_count} CUDA device(s): cuda:0 to cuda:{cuda_count - 1}"
        )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise GrpoError(f"device {name!r}: MPS is not available here; use auto or cpu")
    return device


def set_cpu_threads(threads: int, model_kind: str, device: torch.device) -> None:
    """`threads` > 0: that many; 0 (auto): one for the tiny model on CPU, else torch's default.

    Tiny ops are too small to split: on a busy 2-core machine, 2 threads made tiny generation
    ~15x slower than 1 (contention), measured with `grpo rollout`.
    """
    if threads > 0:
        torch.set_num_threads(threads)
    elif model_kind == "tiny" and device.type == "cpu":
        torch.set_num_threads(1)


def empty_device_cache(device: torch.device) -> None:
    """Give the memory the device's caching allocator holds unused back to the device
    (train.empty_cache_every, the end of a run): `torch.<type>.empty_cache` for CUDA, XPU, MPS and
    the like, on `device`'s own index (torch.cuda's acts on the current device, which a data-parallel
    worker's need not be). A CPU has no such cache: nothing to do."""
    backend = getattr(torch, device.type, None)
    empty = getattr(backend, "empty_cache", None)
    if not callable(empty):
        return
    select = getattr(backend, "device", None)  # torch.cuda.device / torch.xpu.device: a context manager
    if device.index is not None and callable(select):
        with select(device.index):
            empty()
    else:
        empty()


DROPOUTS = (
    torch.nn.Dropout,
    torch.nn.Dropout1d,
    torch.nn.Dropout2d,
    torch.nn.Dropout3d,
    torch.nn.AlphaDropout,
    torch.nn.FeatureAlphaDropout,
)


def disable_dropout(model: torch.nn.Module) -> None:
    """Every dropout of `model` at p = 0 (model.disable_dropout): the dropout modules (GPT-2's,
    LoRA's adapters'), and the rates attention layers keep as plain numbers and hand to the attention
    kernel in train mode (Llama's and Qwen's `attention_dropout`), which a walk for dropout modules
    alone, TRL's, misses. The model's config keeps its values, so an exported model is unchanged."""
    for module in model.modules():
        if isinstance(module, DROPOUTS):
            module.p = 0.0
        for name, value in list(vars(module).items()):
            if "dropout" in name and isinstance(value, (int, float)) and not isinstance(value, bool) and value:
                setattr(module, name, 0.0)


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level: every UTF-8 string encodes, one token per byte, so any data set composes."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    for token in TINY_SPECIAL_TOKENS:
        vocab[token] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = TINY_CHAT_TEMPLATE
    return fast


def tiny_model_config(size: TinyModelConfig, tokenizer: PreTrainedTokenizerFast | None = None) -> LlamaConfig:
    """The tiny Llama's config (`model.tiny.*` and the byte tokenizer's ids): what build_tiny_model
    saves, and what the memory plan sizes without building anything."""
    tokenizer = tokenizer if tokenizer is not None else build_tiny_tokenizer()
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=size.hidden_size,
        intermediate_size=size.intermediate_size,
        num_hidden_layers=size.num_layers,
        num_attention_heads=size.num_heads,
        num_key_value_heads=size.num_heads,
        max_position_embeddings=size.max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )


def build_tiny_model(directory: str | Path, size: TinyModelConfig, seed: int) -> Path:
    """Write a random-init Llama and its tokenizer to `directory`; returns the directory."""
    directory = Path(directory)
    tokenizer = build_tiny_tokenizer()
    config = tiny_model_config(size, tokenizer)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def load_tokenizer(path: str | Path, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """Left padding so every prompt ends where generation starts; pad falls back to EOS."""
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise GrpoError(f"tokenizer in {path} has neither a pad nor an EOS token")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def is_adapter_dir(directory: str | Path) -> bool:
    return (Path(directory) / ADAPTER_CONFIG).is_file()


def adapter_base(adapter: Path) -> Path:
    """The base model under a LoRA adapter given as model.path. A run's checkpoint records it in
    trainer_state.json; an adapter-only export (`grpo export merge_lora=false`) has no such file and
    names it in adapter_config.json, where peft and transformers look for it."""
    if (adapter / COMPLETE_MARKER).is_file():
        return base_model_dir(adapter, read_trainer_state(adapter))
    base = json.loads((adapter / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    if not base or not (Path(base) / "config.json").is_file():
        raise GrpoError(
            f"model.path={adapter}: a LoRA adapter whose base model ({ADAPTER_CONFIG} base_model_name_or_path: "
            f"{base!r}) is not a model directory here; export it with merge_lora=true, or point "
            "base_model_name_or_path at the base's directory"
        )
    return Path(base)


def load_weights(
    directory: Path,
    base_dir: Path,
    dtype: torch.dtype,
    trust_remote_code: bool = False,
    trainable: bool = False,
    key: str = "model.path",
) -> PreTrainedModel | PeftModel:
    """The model a directory holds: its own full weights, or, for a LoRA checkpoint (peft's adapter
    files only), the base model at `base_dir` with the adapter on top. `key`: the setting that named
    the directory, for the one-line error."""
    adapter = is_adapter_dir(directory)
    source = base_dir if adapter else directory
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, trust_remote_code=trust_remote_code)
        if adapter:
            from peft import PeftModel

            with quiet_peft():
                model = PeftModel.from_pretrained(model, directory, is_trainable=trainable)
    except (OSError, ValueError) as err:
        raise GrpoError(f"{key}={source}: cannot load: {err}") from err
    except SafetensorError as err:  # a weights file cut short (a copy, a full disk) or garbled
        damaged = [p for d in (directory, base_dir) for p in sorted(Path(d).glob("*.safetensors")) if not _opens(p)]
        named = damaged[0] if damaged else source
        raise GrpoError(f"{key}={directory}: {named} cannot be read ({err}): cut short or damaged?") from None
    return model


def _opens(path: Path) -> bool:
    """Whether a safetensors file's header reads (cheap: the tensors are not loaded)."""
    try:
        with safe_open(path, framework="pt"):
            return True
    except (SafetensorError, OSError):
        return False


def load_policy(
    cfg: ModelConfig,
    workdir: Path,
    seed: int,
    device: torch.device,
    precision_dtype: str,
    weights_dir: Path | None = None,
) -> tuple[PreTrainedModel | PeftModel, PreTrainedTokenizerBase, Path]:
    """Returns (model in train mode, tokenizer, the starting model's directory).

    `weights_dir` (a checkpoint being resumed) supplies the weights: full weights, or a LoRA
    adapter put on the starting model. The returned directory is always the starting model's,
    which the KL reference must come from.
    """
    if cfg.kind == "tiny":
        # Always inside the run directory, whatever model.path says (validate refuses it with model=tiny):
        # a random model written to a path a real model's name would find passes for that model later.
        path = workdir / "tiny_model"
        if not (path / "config.json").exists():
            build_tiny_model(path, cfg.tiny, seed)
    elif cfg.path and is_adapter_dir(cfg.path) and weights_dir is None:  # a LoRA checkpoint: its base + adapter
        weights_dir, path = Path(cfg.path), adapter_base(Path(cfg.path))
        if not cfg.lora.enabled:  # sampling or evaluating it: the adapter merged, a plain model
            tokenizer = load_tokenizer(weights_dir, cfg.trust_remote_code)
            merged = load_weights(weights_dir, path, DTYPES[_dtype_name(cfg, precision_dtype)]).merge_and_unload()
            return _ready(merged, tokenizer, cfg, device), tokenizer, path
    else:
        path = model_directory(cfg)
        if not (path / "config.json").exists():
            raise GrpoError(f"model.path={path}: no config.json, not a Hugging Face model directory")
    dtype_name = _dtype_name(cfg, precision_dtype)
    source = weights_dir or path
    if weights_dir is not None and is_adapter_dir(weights_dir) != cfg.lora.enabled:
        held = "a LoRA adapter" if is_adapter_dir(weights_dir) else "full weights"
        raise GrpoError(f"checkpoint {weights_dir} holds {held}, but model.lora.enabled={cfg.lora.enabled}")
    try:
        tokenizer = load_tokenizer(source, cfg.trust_remote_code)
    except (OSError, ValueError) as err:
        raise GrpoError(f"model.path={source}: cannot load: {err}") from err
    model = load_weights(source, path, DTYPES[dtype_name], cfg.trust_remote_code, trainable=True)
    if cfg.lora.enabled and not is_peft(model):
        model = add_lora(model, cfg.lora)
    return _ready(model, tokenizer, cfg, device), tokenizer, path


def _dtype_name(cfg: ModelConfig, precision_dtype: str) -> str:
    return precision_dtype if cfg.dtype == "auto" else cfg.dtype


class Float32Head(torch.nn.Linear):
    """The output projection computed in fp32 from weights kept in the run's dtype (ScaleRL's "FP32
    at the LM head"): the logits, and the log-probs and ratios built on them, no longer carry bf16's
    rounding, which the sampler and the trainer would round differently. The weights stay in their
    dtype, so a tied embedding, the checkpoints and a resume are unchanged; autocast is off inside."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        with torch.autocast(hidden.device.type, enabled=False):
            bias = self.bias.float() if self.bias is not None else None
            return torch.nn.functional.linear(hidden.float(), self.weight.float(), bias)


def fp32_lm_head(model: Any) -> None:
    """`model.lm_head_fp32`: the model's output layer becomes a Float32Head in place (same module,
    same parameters and names; only its forward changes)."""
    head = model.get_output_embeddings()
    if type(head) is not torch.nn.Linear:
        raise GrpoError(
            f"model.lm_head_fp32=true needs a plain Linear output layer; this model's is {type(head).__name__}"
        )
    head.__class__ = Float32Head


def _ready(model: Any, tokenizer: PreTrainedTokenizerBase, cfg: ModelConfig, device: torch.device) -> Any:
    """On the device, in train mode (without dropout unless model.disable_dropout=false), padding
    known to generate()."""
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    if cfg.lm_head_fp32:
        fp32_lm_head(model)
    if cfg.gradient_checkpointing:
        # transformers 5.2x renamed it and warns on the old name; the vLLM environment's 5.1x has only that
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable()
        model.config.use_cache = False
    if cfg.disable_dropout:  # the frozen reference is a copy of this, or runs in eval mode when reloaded
        disable_dropout(model)
    model.to(device)
    model.train()
    return model


def is_peft(model: Any) -> bool:
    """Without importing peft: a model can only be a PeftModel once peft is loaded."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


class AdaptersOff:
    """The KL reference of a LoRA policy: the policy itself run with its adapters switched off, which
    is the frozen base. No second copy of the weights, and exact across a resume (the base never trains).

    Called like a model (policy_update only calls it under no_grad); in eval mode for the call, as
    the frozen copy of a full fine-tune is.
    """

    def __init__(self, policy: PeftModel) -> None:
        self.policy = policy

    @property
    def config(self) -> Any:
        """The base model's config (what a layout choice reads: the hidden size)."""
        return self.policy.config

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        """The policy's parameters: the dtype the packed layout's attention mask is built in."""
        return self.policy.parameters()

    def __call__(self, **inputs: Any) -> Any:
        with evaluating(self.policy), self.policy.disable_adapter():
            return self.policy(**inputs)


def frozen_reference(
    policy: PreTrainedModel | PeftModel, starting_dir: Path | None = None
) -> PreTrainedModel | AdaptersOff:
    """The starting policy for the KL term; never trained, never in grad mode.

    A LoRA policy is its own reference with the adapters off. Otherwise a fresh run copies the
    policy; a resumed one reloads the starting model from `starting_dir`, since the policy has moved.
    """
    if is_peft(policy):
        return AdaptersOff(policy)
    if starting_dir is None:
        reference = copy.deepcopy(policy)
    else:
        reference = AutoModelForCausalLM.from_pretrained(starting_dir, dtype=policy.dtype).to(policy.device)
        if isinstance(policy.get_output_embeddings(), Float32Head):  # the KL compares like with like
            fp32_lm_head(reference)
    reference.eval()
    reference.requires_grad_(False)
    return reference
