"""Rollout throughput of rollout.backend=vllm against the hf backend's fast loop, and the weight-sync time.

    pip install 'grpo-cli[vllm]'                 # a CUDA machine
    python benchmarks/vllm_vs_hf.py              # a random-init model of Qwen2.5-0.5B's shape
    python benchmarks/vllm_vs_hf.py --model-dir DIR --prompts 32 --generations 8 --max-new-tokens 512

Without --model-dir the model is built in code, no hub: Qwen2.5-0.5B's shape (hidden 896, 24
layers, 14 heads, 2 KV heads, MLP 4864, vocab 151936, tied embeddings) with random weights in the
chosen dtype, and the project's byte-level tokenizer (grpo_cli.models.build_tiny_tokenizer), saved
to a temporary directory: vLLM loads its engine from disk. Random weights almost never sample an
EOS, so nearly every completion runs to --max-new-tokens: both backends do the same work.

Both backends get the same left-padded prompts and generate G completions each, through the
Generator the trainer uses (make_generator). Generation tokens/s = completion tokens (EOS
included) / wall time of one `generate` call, CUDA synchronised, the median of --repeats calls
after one warm-up call (the vLLM warm-up includes its first weight push). Weight sync: one
`weights_updated()` and the push it causes (every weight, merged names, into the engine), median
of --repeats. Needs CUDA and vLLM, and stops at once saying which is missing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from grpo_cli.config.schema import RolloutConfig, VllmConfig
from grpo_cli.models import DTYPES, build_tiny_tokenizer, load_tokenizer
from grpo_cli.rollout import Generator, make_generator
from grpo_cli.rollout.prompts import PromptEncoder
from grpo_cli.rollout.vllm import VLLMGenerator, vllm_unavailable

QWEN25_05B = {  # Qwen2.5-0.5B's config.json, the fields that set the work
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}


def qwen_shaped_model(directory: Path, dtype: torch.dtype) -> Path:
    """A random-init Qwen2.5-0.5B-shaped model and the byte tokenizer, saved to `directory`."""
    tokenizer = build_tiny_tokenizer()
    config = Qwen2Config(
        **QWEN25_05B,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(config).to(dtype)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    del model
    torch.cuda.empty_cache()
    return directory


def timed_generations(
    generator: Generator, ids: torch.Tensor, mask: torch.Tensor, generations: int, repeats: int
) -> tuple[list[float], list[int]]:
    """(seconds, completion tokens) of each timed `generate`, after one untimed warm-up."""
    generator.generate(ids, mask, generations)
    seconds, tokens = [], []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        rollout = generator.generate(ids, mask, generations)
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
        tokens.append(int(rollout.lengths.sum()))
    return seconds, tokens


def weight_sync_seconds(generator: VLLMGenerator, repeats: int) -> list[float]:
    seconds = []
    for _ in range(repeats):
        generator.weights_updated()
        torch.cuda.synchronize()
        start = time.perf_counter()
        generator.sync.sync()
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return seconds


def row(backend: str, loop: str, seconds: list[float], tokens: list[int]) -> str:
    rates = [n / s for n, s in zip(tokens, seconds)]
    return (
        f"| {backend} | {loop} | {statistics.median(rates):,.0f} | {statistics.median(tokens):,.0f} "
        f"| {statistics.median(seconds):.3f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, help="a local Hugging Face model directory (default: built)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="the policy's (and engine's) dtype")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--generations", type=int, default=8, help="G completions per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per backend, after one warm-up")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument("--enforce-eager", action="store_true", help="vLLM without CUDA graphs")
    args = parser.parse_args()

    problem = vllm_unavailable()
    if problem is not None:
        sys.exit(f"vllm_vs_hf: {problem}")
    dtype = DTYPES[args.dtype]
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model_dir or qwen_shaped_model(Path(tmp) / "qwen2.5-0.5b-shape", dtype)
        tokenizer = load_tokenizer(model_dir)
        policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).cuda()
        prompts = [f"Question {i}: what is {7 * i + 3} plus {13 * i + 5}? Answer:" for i in range(args.prompts)]
        ids, mask = PromptEncoder(tokenizer, 512, torch.device("cuda"))(prompts)
        sampling = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature}
        engine = VllmConfig(
            gpu_memory_utilization=args.gpu_memory_utilization, enforce_eager=args.enforce_eager, dtype=args.dtype
        )
        params = sum(p.numel() for p in policy.parameters())
        print(f"model: {model_dir} ({params / 1e6:.0f}M parameters, {args.dtype}); {ids.size(0)} prompts ", end="")
        print(f"of up to {ids.size(1)} tokens, G={args.generations}, max_new_tokens={args.max_new_tokens}")

        hf, hf_loop = make_generator(policy, tokenizer, RolloutConfig(loop="fast", **sampling))
        hf_seconds, hf_tokens = timed_generations(hf, ids, mask, args.generations, args.repeats)
        del hf
        torch.cuda.empty_cache()  # the fast loop's cache blocks: vLLM sizes its KV cache from free memory

        engine_generator, vllm_loop = make_generator(
            policy, tokenizer, RolloutConfig(backend="vllm", vllm=engine, **sampling), max_prompt_tokens=ids.size(1)
        )
        vllm_seconds, vllm_tokens = timed_generations(engine_generator, ids, mask, args.generations, args.repeats)
        sync = weight_sync_seconds(engine_generator, args.repeats)

    print("\n| backend | loop | generation tokens/s | completion tokens | s per generate |")
    print("|---|---|---:|---:|---:|")
    print(row("hf", hf_loop, hf_seconds, hf_tokens))
    print(row("vllm", vllm_loop, vllm_seconds, vllm_tokens))
    speedup = statistics.median(hf_seconds) / statistics.median(vllm_seconds)
    print(f"\nvllm / hf speed-up (median s per generate): {speedup:.1f}x")
    stats = engine_generator.sync.stats
    print(
        f"weight sync: {statistics.median(sync):.3f} s median of {len(sync)} "
        f"({stats.tensors // stats.pushes} tensors, {stats.bytes / stats.pushes / 2**20:.0f} MiB per push)"
    )


if __name__ == "__main__":
    main()
