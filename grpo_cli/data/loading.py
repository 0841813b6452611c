"""Turn the data config into train/eval example lists and a repeatable prompt order."""

from __future__ import annotations

import logging
import random
from importlib.resources import as_file, files
from typing import Any

from grpo_cli.config.checks import fail
from grpo_cli.config.schema import DataConfig
from grpo_cli.data.arithmetic import arithmetic_examples
from grpo_cli.data.hf import read_hf_prompts
from grpo_cli.data.jsonl import read_jsonl_prompts
from grpo_cli.errors import GrpoError

MATH_PROBLEMS = "math_problems.jsonl"  # shipped in grpo_cli/data: word problems with numeric answers
CODE_TASKS = "code_tasks.jsonl"  # shipped in grpo_cli/data: Python tasks with tests (reward=code)
PACKAGED = {"math": MATH_PROBLEMS, "code": CODE_TASKS}  # data kinds that need no path
# Fewer held-out prompts than this make an accuracy that moves in steps of over 10 points: the split
# is kept (the same seed, the same rows, as ever), and said out loud.
MIN_HELD_OUT = 10
log = logging.getLogger("grpo")


def load_examples(cfg: DataConfig) -> list[dict[str, Any]]:
    """All examples the config selects, before the train/eval split."""
    if cfg.max_examples < 0:  # a negative cap would slice off the last rows, silently
        fail("data.max_examples", cfg.max_examples, "must be >= 0 (0: all)")
    if cfg.kind == "arithmetic":
        examples = arithmetic_examples(cfg.num_examples, cfg.max_operand, list(cfg.operations), cfg.seed)
    elif cfg.kind in PACKAGED:
        with as_file(files("grpo_cli.data") / PACKAGED[cfg.kind]) as path:  # a real path even from a zip
            examples = read_jsonl_prompts(path, "prompt")
    elif cfg.kind == "hf":
        examples = read_hf_prompts(cfg)
    else:
        examples = read_jsonl_prompts(cfg.path, cfg.prompt_field, cfg.answer_field)
    if cfg.fraction < 1.0:
        examples = examples[: max(1, int(len(examples) * cfg.fraction))]
    if cfg.max_examples > 0:
        examples = examples[: cfg.max_examples]
    return render_prompts(examples, cfg.template, cfg.chat)


def render_prompts(examples: list[dict[str, Any]], template: str | None, chat: bool) -> list[dict[str, Any]]:
    """`data.template` and `data.chat`: the same rows phrased for an instruct model ("What is 23 + 45?"
    as a user message) without a data file of their own; every other column stays as it was.

    >>> render_prompts([{"prompt": "2+3=", "a": "2", "b": "3"}], "What is {a} + {b}?", chat=True)
    [{'prompt': [{'role': 'user', 'content': 'What is 2 + 3?'}], 'a': '2', 'b': '3'}]
    """
    if template is None and not chat:
        return examples
    rendered = []
    for i, example in enumerate(examples):
        prompt = example["prompt"]
        if template is not None:
            try:
                prompt = template.format(**example)
            except (KeyError, IndexError, ValueError, AttributeError, TypeError) as err:
                columns = ", ".join(sorted(example))
                raise GrpoError(f"data.template={template!r}: row {i + 1}: {err!r} (its columns: {columns})") from err
        if chat and isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        rendered.append({**example, "prompt": prompt})
    return rendered


def split_examples(
    examples: list[dict[str, Any]], eval_fraction: float, seed: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Seeded hold-out; training always keeps at least one example. A held-out side under
    MIN_HELD_OUT prompts (a 40-row file at 0.05 holds out 2) is a warning naming the key."""
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    n_eval = min(int(len(examples) * eval_fraction), len(examples) - 1)
    if 0 < n_eval < MIN_HELD_OUT:
        log.warning(
            "data.eval_fraction=%g holds out %d of %d examples: an accuracy over them moves in steps of %.0f%%; "
            "raise data.eval_fraction for %d or more, or set it to 0 to train on all %d",
            eval_fraction,
            n_eval,
            len(examples),
            100 / n_eval,
            MIN_HELD_OUT,
            len(examples),
        )
    eval_idx = set(order[:n_eval])
    train = [ex for i, ex in enumerate(examples) if i not in eval_idx]
    held_out = [ex for i, ex in enumerate(examples) if i in eval_idx]
    return train, held_out


def check_prompts_per_step(prompts_per_step: int, train: int, held_out: int, skipped: int = 0) -> None:
    """Refuse at setup a step the training split cannot fill: with no examples the sampler would
    wait forever for one, and with fewer than a step's prompts every step would draw some twice."""
    if prompts_per_step <= train:
        return
    removed = f"; {skipped} skipped as too long (data.on_long_prompt=skip)" if skipped else ""
    raise GrpoError(
        f"train.prompts_per_step={prompts_per_step} is more than the {train} training example(s) "
        f"({train + held_out + skipped} in the data, {held_out} held out by data.eval_fraction{removed}): "
        f"set train.prompts_per_step to at most {train}, or give more data"
        if train
        else f"train.prompts_per_step={prompts_per_step}: the data selects no training examples "
        f"({held_out} held out by data.eval_fraction{removed}): nothing to train on"
    )


class PromptSampler:
    """Epochs of seeded permutations; the state is two integers, so a resume replays exactly."""

    def __init__(self, examples: list[dict[str, Any]], seed: int) -> None:
        self.examples = examples
        self.seed = seed
        self.epoch = 0
        self.position = 0

    def _order(self) -> list[int]:
        order = list(range(len(self.examples)))
        random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        return order

    def next_batch(self, size: int) -> list[dict[str, Any]]:
        batch = []
        order = self._order()
        while len(batch) < size:
            if self.position >= len(order):
                self.epoch += 1
                self.position = 0
                order = self._order()
            batch.append(self.examples[order[self.position]])
            self.position += 1
        return batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = state["epoch"], state["position"]
