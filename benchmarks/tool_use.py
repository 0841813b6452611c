"""Learning to call a tool: SmolLM2-135M-Instruct and the calculator (docs/benchmarks.md#learning-to-call-a-tool).

    python benchmarks/tool_use.py [--seeds 0 1 2] [--steps 20] [--out DIR] [--override KEY=VALUE] [--table]
    python benchmarks/tool_use.py --write-data FILE     # only the prompts recipes/smollm2_135m_tool_use.yaml reads

Writes the prompts (3-digit multiplications, each after two worked calls of the calculate tool as
earlier chat turns), then per seed: `grpo rollout` of the packaged model on the held-out prompts
(before), `grpo train` with recipes/smollm2_135m_tool_use.yaml, and the same rollout of its final
checkpoint (after). Each eval samples G=4 trajectories of 20 held-out prompts at temperature 1 with
the rollout seeded by the run's seed, and counts: tool calls per trajectory, the share that made a
call that ran (the tool-call rate), the share whose calls all failed, and the share ending on the
product (held-out accuracy, as last_number scores it). Raw outputs stay under --out.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from grpo_cli.data.arithmetic import arithmetic_examples  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RECIPE = "smollm2_135m_tool_use"
SYSTEM = "Always call the calculate tool for arithmetic, then answer with the number it returns."
WORKED = [(123, 45), (608, 917)]  # two calls shown before the problem: with none, 0 of 40 calls; with one, 3 of 40
CALL = '<tool_call>\n{{"name": "calculate", "arguments": {{"expression": "{a} * {b}"}}}}\n</tool_call>'
EVAL = [  # the recipe's rollout settings, on its held-out split
    "env=calculator", "env.max_turns=3", "split=eval", "max_prompts=20", "rollout.num_generations=4",
    "rollout.max_new_tokens=64", "rollout.temperature=1.0", "data.eval_fraction=0.1", "data.max_prompt_tokens=512",
    "batch_size=10", "threads=1", "console=plain",
]  # fmt: skip


def messages(a: int, b: int) -> list[dict[str, str]]:
    """The chat a prompt is: the instruction, two worked calls with the tool's answers, the problem."""
    chat = [{"role": "system", "content": SYSTEM}]
    for x, y in WORKED:
        chat += [
            {"role": "user", "content": f"What is {x} * {y}?"},
            {"role": "assistant", "content": CALL.format(a=x, b=y)},
            {"role": "tool", "content": str(x * y)},
            {"role": "assistant", "content": str(x * y)},
        ]
    return [*chat, {"role": "user", "content": f"What is {a} * {b}?"}]


def write_data(path: Path) -> None:
    """2,000 distinct products a x b, a and b in 0..999 (seeded), as chat prompts with an answer column."""
    rows = arithmetic_examples(2000, 999, ["*"], seed=0)
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps({"prompt": messages(int(row["a"]), int(row["b"])), "answer": row["answer"]}) + "\n")


def grpo(*args: str, log: Path) -> float:
    """One grpo command from the repository root, its output kept; its wall time."""
    started = time.perf_counter()
    with log.open("w") as out:
        command = [sys.executable, "-m", "grpo_cli", *args]
        subprocess.run(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, check=True)
    return time.perf_counter() - started


def evaluate(model: list[str], data: Path, seed: int, out: Path) -> dict[str, float]:
    """The held-out figures of one model (see the module docstring)."""
    rollouts = out / "rollouts.jsonl"
    wall = grpo("rollout", *model, "data=jsonl", f"data.path={data}", *EVAL, f"seed={seed}", f"output={rollouts}",
                f"hydra.run.dir={out / 'run'}", log=out / "rollout.log")  # fmt: skip
    calls, ran, all_failed, right = [], [], [], []
    for line in rollouts.read_text().splitlines():
        record = json.loads(line)
        for completion in record["completions"]:
            made, errors = completion["env"]["env_tool_calls"], completion["env"]["env_tool_errors"]
            numbers = re.findall(r"-?\d+(?:\.\d+)?", completion["text"])
            calls.append(made)
            ran.append(made > errors)
            all_failed.append(made > 0 and made == errors)
            right.append(bool(numbers) and numbers[-1] == str(record["answer"]))
    n = len(calls)
    return {
        "trajectories": n, "calls_per_episode": sum(calls) / n, "call_rate": sum(ran) / n,
        "failed_call_rate": sum(all_failed) / n, "accuracy": sum(right) / n, "wall_s": round(wall, 1),
    }  # fmt: skip


def train(data: Path, seed: int, steps: int, out: Path, overrides: list[str]) -> tuple[Path, dict]:
    """One recipe run (with --override's keys); its final checkpoint and its reward and tool calls over the steps."""
    run = out / "train"
    wall = grpo("train", "--config-dir", str(ROOT / "recipes"), "-cn", RECIPE, f"data.path={data}",
                f"train.seed={seed}", f"train.steps={steps}", "monitor.console=plain", "monitor.plots=false",
                f"hydra.run.dir={run}", *overrides, log=out / "train.log")  # fmt: skip
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps_logged = [m for m in metrics if "reward/mean" in m]
    curve = {
        "wall_s": round(wall, 1),
        "reward": [round(m["reward/mean"], 3) for m in steps_logged],
        "tool_calls": [round(m.get("env/tool_calls_mean", float("nan")), 3) for m in steps_logged],
    }
    return run / "checkpoints" / f"step_{steps:06d}", curve


def table(results: dict[int, dict]) -> str:
    """Before -> after per seed, and the mean over seeds."""
    keys = [("calls_per_episode", "{:.2f}"), ("call_rate", "{:.0%}"), ("failed_call_rate", "{:.0%}"),
            ("accuracy", "{:.0%}")]  # fmt: skip
    lines = [
        "| seed | calls per episode | tool-call rate (a call ran) | all calls failed | held-out accuracy | train s |",
        "|---|---|---|---|---|---:|",
    ]
    rows = [*((str(seed), r) for seed, r in results.items())]
    mean = {p: {k: statistics.mean(r[p][k] for r in results.values()) for k, _ in keys} for p in ("before", "after")}
    mean["train"] = {"wall_s": statistics.mean(r["train"]["wall_s"] for r in results.values())}
    for name, r in [*rows, ("mean", mean)]:
        cells = [f"{fmt.format(r['before'][k])} -> {fmt.format(r['after'][k])}" for k, fmt in keys]
        lines.append(f"| {name} | {' | '.join(cells)} | {r['train']['wall_s']:.0f} |")
    return "\n".join(lines)


def collected(out: Path) -> dict[int, dict]:
    """Every seed's figures under --out, those of earlier or concurrent invocations included."""
    found = {int(path.parent.name.removeprefix("seed_")): path for path in out.glob("seed_*/result.json")}
    return {seed: json.loads(found[seed].read_text()) for seed in sorted(found)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=20, help="train.steps of each run")
    parser.add_argument("--out", type=Path, default=Path("tool_use_runs"), help="raw outputs, one folder a seed")
    parser.add_argument("--override", action="append", default=[], help="a key=value for grpo train, e.g. an ablation")
    parser.add_argument("--write-data", type=Path, help="only write the prompts to this file, and stop")
    parser.add_argument("--table", action="store_true", help="only print the table of the seeds already under --out")
    args = parser.parse_args()
    if args.write_data:
        write_data(args.write_data)
        return
    if args.table:
        results = collected(args.out)
        print(table(results) if results else f"no seed_*/result.json under {args.out}")
        return
    args.out.mkdir(parents=True, exist_ok=True)
    data = (args.out / "tool_use.jsonl").resolve()
    write_data(data)
    for seed in args.seeds:
        out = (args.out / f"seed_{seed}").resolve()
        (out / "before").mkdir(parents=True, exist_ok=True)
        (out / "after").mkdir(parents=True, exist_ok=True)
        before = evaluate(["model=smollm2_135m"], data, seed, out / "before")
        checkpoint, curve = train(data, seed, args.steps, out, args.override)
        after = evaluate(["model=hf", f"model.path={checkpoint}"], data, seed, out / "after")
        (out / "result.json").write_text(json.dumps({"before": before, "after": after, "train": curve}))
        print(json.dumps({"seed": seed, **json.loads((out / "result.json").read_text())}), flush=True)
    print(table(collected(args.out)))


if __name__ == "__main__":
    main()
