"""Multi-turn rollouts on the real model (docs/environments.md, docs/benchmarks.md#multi-turn-rollouts).

    python benchmarks/multi_turn.py code_feedback [--model-path DIR]   # pass rate after turn 1 and turn 2
    python benchmarks/multi_turn.py calculator [--model-path DIR]      # tool calls, and right answers

Runs `grpo rollout` with the environment on SmolLM2-135M-Instruct (the packaged model; --model-path:
a trained checkpoint or export instead) and reads the trajectories it wrote:
- code_feedback: the held-out code tasks (split=eval), env.max_turns=2; a task counts as passed after
  turn k when an answer up to turn k passed every test unit (env_turn_scores);
- calculator: arithmetic prompts as chat, env.max_turns=3; how many trajectories call the tool, and
  how many end on the right answer (the last number of the last turn).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SETTINGS = {
    "code_feedback": [
        "data=code", "env=code_feedback", "env.max_turns=2", "split=eval", "rollout.num_generations=8",
        "rollout.max_new_tokens=256", "data.max_prompt_tokens=512", "batch_size=4",
    ],
    "calculator": [
        "data=arithmetic", "env=calculator", "env.max_turns=3", "split=eval", "max_prompts=16",
        "rollout.num_generations=4", "rollout.max_new_tokens=64", "data.max_prompt_tokens=400", "batch_size=8",
        "data.template='What is {a} {op} {b}? Use the calculate tool, then give the number.'",
    ],
}  # fmt: skip


def rollouts(kind: str, model_path: str | None, out: Path) -> list[dict]:
    model = ["model=hf", f"model.path={model_path}"] if model_path else ["model=smollm2_135m"]
    command = [sys.executable, "-m", "grpo_cli", "rollout", *model, *SETTINGS[kind], f"output={out}", "console=plain"]
    command.append(f"hydra.run.dir={out.parent / 'run'}")
    subprocess.run(command, check=True)
    return [c for line in out.read_text().splitlines() for c in json.loads(line)["completions"]]


def code_feedback(completions: list[dict]) -> dict[str, float]:
    scores = [c["env"]["env_turn_scores"] for c in completions]
    passed = [[s == 1.0 for s in row] for row in scores]
    return {
        "trajectories": len(scores),
        "pass_after_turn_1": sum(row[:1] == [True] for row in passed) / len(passed),
        "pass_after_turn_2": sum(any(row[:2]) for row in passed) / len(passed),
        "mean_units_turn_1": sum(row[0] for row in scores if row) / len(scores),
        "mean_units_final": sum(row[-1] for row in scores if row) / len(scores),
        "second_turns": sum(len(row) > 1 for row in scores) / len(scores),
    }


def calculator(completions: list[dict], records: list[dict]) -> dict[str, float]:
    def last_number(text: str) -> str | None:
        found = re.findall(r"-?\d+(?:\.\d+)?", text)
        return found[-1] if found else None

    calls = [c["env"].get("env_tool_calls") or 0 for c in completions]
    right = [last_number(c["text"]) == str(answer) for c, answer in zip(completions, records)]
    return {
        "trajectories": len(completions),
        "called_the_tool": sum(n > 0 for n in calls) / len(calls),
        "calls_mean": sum(calls) / len(calls),
        "right_answer": sum(right) / len(right),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=sorted(SETTINGS))
    parser.add_argument("--model-path", help="a trained checkpoint or exported directory instead of SmolLM2")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rollouts.jsonl"
        started = time.perf_counter()
        completions = rollouts(args.kind, args.model_path, out)
        wall = time.perf_counter() - started
        if args.kind == "code_feedback":
            figures = code_feedback(completions)
        else:
            records = [json.loads(line) for line in out.read_text().splitlines()]
            answers = [r["answer"] for r in records for _ in r["completions"]]
            figures = calculator(completions, answers)
    print(
        json.dumps({"kind": args.kind, "model": args.model_path or "smollm2_135m", **figures, "wall_s": round(wall, 1)})
    )


if __name__ == "__main__":
    main()
