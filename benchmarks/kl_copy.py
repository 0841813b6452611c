"""Why the logged k3 KL runs 2-3x TRL's when the bf16 sampling copy samples (issue 56, item 4).

    python benchmarks/kl_copy.py train --config copy --seed 0 --out runs/          # one run, kept as JSON
    python benchmarks/kl_copy.py train --config copy --seed 0 --out runs/ --save-at 10   # + the weights
    python benchmarks/kl_copy.py estimate --weights runs/copy_seed0_step10 --out runs/  # fixed weights
    python benchmarks/kl_copy.py report --out runs/ --json kl_copy.json                # the tables

The workload is benchmarks/vs_trl.py's `smollm2` (its grpo_config, so every setting is the vs-TRL
one: SmolLM2-135M, chat additions, last_number, 4 x 4, 32 new tokens, lr 1e-5, beta 0.04 k3, dapo,
fp32), grpo only, one torch thread. Each `train` run is its own process (one model set in memory).

Configs (what separates the candidate causes):

    policy        rollout.sampling_weights=policy: the fp32 policy samples itself (agrees with TRL)
    copy          sampling_weights=auto: the bf16 copy samples, algo.rollout_correction token_truncate cap 2
    copy_nocorr   the copy, algo.rollout_correction.mode=none: its weights out of the loss
    copy_fp32     the copy's module and refresh path at fp32 (SamplingCopy(dtype=None)): no rounding

`estimate` (fixed weights): the policy saved after N steps of a copy run, 64 prompts x 4 sampled
once from the bf16 copy and once from the policy; on each set the mean per-token k3 (what `kl`
logs), the exact KL(pi || ref) summed over the vocabulary at each sampled position, and the k3
reweighted by pi/pi_copy. k3 on the copy's samples far above k3 on the policy's would mean the
logged figure is biased at equal weights; equal figures mean the training itself moved further.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import vs_trl  # noqa: E402  (the smollm2 workload and grpo's config for it: one definition)

CONFIGS = ("policy", "copy", "copy_nocorr", "copy_fp32")
REPORT_STEPS = (5, 10, 20)
CHUNK_ROWS = 16  # rows per exact-KL forward: 16 x ~70 positions x 49k vocabulary of fp32 logits


def trainer_for(config: str, seed: int, steps: int, run_dir: Path, model_cache: str | None) -> Any:
    """grpo's trainer on the smollm2 workload, set up, with `config`'s sampling settings."""
    from grpo_cli.training.trainer import GRPOTrainer

    workload = vs_trl.WORKLOADS["smollm2"]
    model_dir = vs_trl.real_model_directory(workload, model_cache)
    spec = vs_trl.RunSpec(
        "grpo",
        workload,
        seed,
        steps,
        1,
        False,
        str(model_dir),
        str(run_dir),
        str(run_dir / "r.json"),
        grpo_sampling="policy" if config == "policy" else "auto",
    )
    cfg = vs_trl.grpo_config(spec)
    if config == "copy_nocorr":
        cfg.algo.rollout_correction.mode = "none"
    if config == "copy_fp32":  # the same module, refresh and engine_logps path, without the bf16 rounding
        import grpo_cli.rollout.engine as engine
        from grpo_cli.rollout.sampling_copy import SamplingCopy

        engine.SamplingCopy = functools.partial(SamplingCopy, dtype=None)  # type: ignore[misc]
    trainer = GRPOTrainer(cfg, run_dir, observers=[])
    trainer.setup()
    return trainer


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


def train(args: argparse.Namespace) -> None:
    """One run: per-step kl, reward, engine gap and correction figures, kept as JSON in --out."""
    import torch

    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"{args.config}_seed{args.seed}"
    trainer = trainer_for(args.config, args.seed, args.steps, args.out / f"{name}_run", args.model_cache)
    copy = getattr(trainer.generator, "copy", None)  # the FastGenerator's SamplingCopy, or None
    steps = []
    for index in range(args.steps):
        t0 = time.perf_counter()
        m = trainer.step().metrics
        record = {"step": index + 1, "step_s": time.perf_counter() - t0, "kl": _number(m.get("kl"))}
        record |= {"reward": float(m["reward/mean"]), "completion_len": float(m["completion_len/mean"])}
        record |= {k: _number(v) for k, v in m.items() if k.startswith(("rollout/", "rollout_correction/"))}
        record |= {k: _number(m.get(k)) for k in ("grad_norm", "clip_frac", "frac_zero_std_groups", "entropy")}
        if copy is not None:  # the copy is the policy's weights after the step: never a step stale
            record["copy_stale_max"] = max(
                float((mine.float() - theirs.to(mine.dtype).float()).abs().max()) for mine, theirs in copy.pairs
            )
        steps.append(record)
        print(
            f"{name} step {index + 1}: kl {record['kl']} reward {record['reward']:.3f} "
            f"gap {record.get('rollout/engine_gap')} {record['step_s']:.1f} s",
            file=sys.stderr,
            flush=True,
        )
        if args.save_at == index + 1:
            trainer.model.save_pretrained(args.out / f"{name}_step{index + 1}")
            trainer.tokenizer.save_pretrained(args.out / f"{name}_step{index + 1}")
    result = {
        "config": args.config,
        "seed": args.seed,
        "steps": steps,
        "sampling_weights": trainer.diagnostics.get("sampling_weights"),
        "copy_dtype": str(next(copy.module.parameters()).dtype) if copy is not None else None,
    }
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=1))


def token_figures(model: Any, reference: Any, rollout: Any, engine_logps: Any) -> dict[str, float]:
    """Over every completion token of `rollout`: mean k3 (the logged estimator), mean exact
    KL(pi || ref) over the vocabulary at the sampled positions, the k3 reweighted by pi / pi_engine
    (self-normalised) and the mean |log pi - log pi_engine|."""
    import torch

    from grpo_cli.core.loss import kl_penalty

    sums = {"k3": 0.0, "exact": 0.0, "k1": 0.0, "gap": 0.0, "gap_ref": 0.0, "abs_k1": 0.0, "w": 0.0, "wk3": 0.0}
    tokens = 0.0
    for start in range(0, rollout.completion_ids.size(0), CHUNK_ROWS):
        rows = slice(start, start + CHUNK_ROWS)
        ids = torch.cat([rollout.prompt_ids[rows], rollout.completion_ids[rows]], 1)
        mask = torch.cat([rollout.prompt_mask[rows], rollout.completion_mask[rows]], 1)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        p, c = rollout.prompt_ids.size(1), rollout.completion_ids.size(1)
        with torch.no_grad():
            out = [
                net(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, p - 1 : p + c - 1]
                for net in (model, reference)
            ]
        logp, logref = (o.float().log_softmax(-1) for o in out)
        taken = rollout.completion_ids[rows].unsqueeze(-1)
        pol, ref = logp.gather(-1, taken).squeeze(-1), logref.gather(-1, taken).squeeze(-1)
        m = rollout.completion_mask[rows].float()
        exact = (logp.exp() * (logp - logref)).sum(-1)
        k3 = kl_penalty(pol, ref, "k3")
        sums["k3"] += float((k3 * m).sum())
        sums["exact"] += float((exact * m).sum())
        sums["k1"] += float(((pol - ref) * m).sum())
        sums["abs_k1"] += float(((pol - ref).abs() * m).sum())  # how far the policy moved, per token
        tokens += float(m.sum())
        if engine_logps is not None:
            eng = engine_logps[rows]
            w = (pol - eng).exp().nan_to_num(0.0) * m
            sums["gap"] += float(((pol - eng).abs().nan_to_num(0.0) * m).sum())
            sums["gap_ref"] += float(((ref - eng).abs().nan_to_num(0.0) * m).sum())  # the copy near ref, or pi?
            sums["w"] += float(w.sum())
            sums["wk3"] += float((w * k3).sum())
    figures = {key: sums[key] / tokens for key in ("k3", "exact", "k1", "abs_k1", "gap", "gap_ref")}
    figures["k3_reweighted"] = sums["wk3"] / sums["w"] if sums["w"] else figures["k3"]
    figures["tokens"] = tokens
    # per completion, not per token: a shorter completion's tokens weigh more in the per-token mean
    figures["exact_per_completion"] = sums["exact"] / rollout.completion_ids.size(0)
    figures["k3_per_completion"] = sums["k3"] / rollout.completion_ids.size(0)
    return figures


def estimate(args: argparse.Namespace) -> None:
    """Fixed weights (--weights, a copy run's save): the estimator on the copy's and the policy's samples."""
    import torch
    from transformers import AutoModelForCausalLM

    from grpo_cli.data import PromptSampler
    from grpo_cli.training.pipeline import generate_groups

    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    trainer = trainer_for("copy", args.seed, 1, args.out / "estimate_run", args.model_cache)
    saved = AutoModelForCausalLM.from_pretrained(args.weights, dtype=torch.float32)
    trainer.model.load_state_dict(saved.state_dict())
    gen = trainer.generator
    gen.copy.refresh()
    examples = PromptSampler(trainer.train_examples, 1000 + args.seed).next_batch(args.prompts)
    results = {}
    for source in ("copy", "policy"):
        sampler_copy = gen.copy
        gen.copy = sampler_copy if source == "copy" else None
        torch.manual_seed(args.seed)
        t0 = time.perf_counter()
        rollout = generate_groups(examples, trainer.encoder, gen, args.generations)
        gen.copy = sampler_copy
        figures = token_figures(trainer.model, trainer.learner.reference, rollout, rollout.engine_logps)
        figures["generate_s"] = time.perf_counter() - t0
        figures["completion_len"] = float(rollout.completion_mask.sum(1).float().mean())
        results[source] = figures
        print(source, json.dumps(figures), file=sys.stderr, flush=True)
    out = {
        "weights": str(args.weights),
        "prompts": args.prompts,
        "generations": args.generations,
        "seed": args.seed,
        "results": results,
    }
    (args.out / f"estimate_seed{args.seed}.json").write_text(json.dumps(out, indent=1))


def _mean_sd(values: list[float]) -> str:
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {sd:.3f}"


def config_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-seed and mean ± sd KL at REPORT_STEPS, reward windows 1-10 / 11-20, mean engine gap."""
    summary: dict[str, Any] = {"seeds": [r["seed"] for r in runs]}
    for step in REPORT_STEPS:
        summary[f"kl{step}"] = [r["steps"][step - 1]["kl"] for r in runs if len(r["steps"]) >= step]
    for lo, hi in ((1, 10), (11, 20)):
        done = [r["steps"][lo - 1 : hi] for r in runs if len(r["steps"]) >= hi]  # runs that reached the window
        summary[f"reward{lo}-{hi}"] = [statistics.mean(s["reward"] for s in steps) for steps in done]
        # one step's KL swings by 2x from the next: the window's mean is the steadier figure
        summary[f"kl{lo}-{hi}"] = [statistics.mean(s["kl"] for s in steps) for steps in done]
    summary["completion_len"] = statistics.mean(s["completion_len"] for r in runs for s in r["steps"])
    gaps = [s.get("rollout/engine_gap") for r in runs for s in r["steps"]]
    summary["engine_gap"] = statistics.mean(g for g in gaps if g is not None) if any(gaps) else None
    stale = [s["copy_stale_max"] for r in runs for s in r["steps"] if "copy_stale_max" in s]
    summary["copy_stale_max"] = max(stale) if stale else None
    return summary


def report(args: argparse.Namespace) -> None:
    runs: dict[str, list[dict[str, Any]]] = {}
    for config in CONFIGS:
        files = sorted(args.out.glob(f"{config}_seed*.json"))
        if files:
            runs[config] = [json.loads(f.read_text()) for f in files]
    summaries = {c: config_summary(r) for c, r in runs.items()}
    print(
        "| config | seeds | KL step 5 | KL step 10 | KL step 20 | KL mean 1-10 | KL mean 11-20 | reward 1-10 "
        "| reward 11-20 | engine_gap | length |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for c, s in summaries.items():
        gap = "-" if s["engine_gap"] is None else f"{s['engine_gap']:.4f}"
        keys = [f"kl{k}" for k in REPORT_STEPS] + ["kl1-10", "kl11-20", "reward1-10", "reward11-20"]
        cells = [_mean_sd(s[key]) for key in keys]
        print(f"| {c} | {len(s['seeds'])} | " + " | ".join(cells) + f" | {gap} | {s['completion_len']:.1f} |")
    print("\nper seed KL at steps 5 / 10 / 20; mean KL steps 1-10 / 11-20:")
    for c, r in runs.items():
        for run in r:
            kls = " / ".join(f"{run['steps'][k - 1]['kl']:.3f}" for k in REPORT_STEPS if len(run["steps"]) >= k)
            windows = " / ".join(
                f"{statistics.mean(s['kl'] for s in run['steps'][lo - 1 : hi]):.3f}"
                for lo, hi in ((1, 10), (11, 20))
                if len(run["steps"]) >= hi
            )
            print(f"  {c} seed {run['seed']}: {kls}; {windows}")
    estimates = [json.loads(f.read_text()) for f in sorted(args.out.glob("estimate_seed*.json"))]
    if estimates:
        print(
            "\nfixed weights: | samples from | k3 (logged) | exact KL(pi||ref) | k1 | k3 x pi/pi_copy | gap | tokens |"
        )
        for e in estimates:
            for source, f in e["results"].items():
                print(
                    f"  {e['weights']} seed {e['seed']} {source}: {f['k3']:.4f} | {f['exact']:.4f} | "
                    f"{f['k1']:.4f} | {f['k3_reweighted']:.4f} | {f['gap']:.4f} | {f['tokens']:.0f}"
                )
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "summaries": summaries, "estimates": estimates}, indent=1))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("train", "estimate", "report"))
    parser.add_argument("--config", choices=CONFIGS, default="copy")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--save-at", type=int, help="train: save the policy after this step")
    parser.add_argument("--weights", type=Path, help="estimate: a saved policy (train --save-at)")
    parser.add_argument("--prompts", type=int, default=64, help="estimate: prompts sampled")
    parser.add_argument("--generations", type=int, default=4, help="estimate: completions per prompt")
    parser.add_argument("--out", type=Path, required=True, help="where runs are kept and read from")
    parser.add_argument("--json", type=Path, help="report: write every figure here")
    parser.add_argument("--model-cache", help="the converted model's cache (default model.cache_dir)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ["HF_HUB_OFFLINE"] = "1"
    {"train": train, "estimate": estimate, "report": report}[args.command](args)


if __name__ == "__main__":
    main()
