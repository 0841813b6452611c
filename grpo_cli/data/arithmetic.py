"""A seeded arithmetic task: small enough that a tiny model learns it on a CPU in minutes."""

from __future__ import annotations

import itertools
import operator
import random

from grpo_cli.config.checks import fail
from grpo_cli.errors import GrpoError

OPERATIONS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def arithmetic_examples(num_examples: int, max_operand: int, operations: list[str], seed: int) -> list[dict[str, str]]:
    """Distinct problems `a<op>b=` with their answers, shuffled by `seed`.

    Problems are distinct so the held-out eval split never repeats a training prompt. The operands
    and the operator are columns too, so `data.template` can phrase the problem for an instruct model.

    >>> arithmetic_examples(2, 3, ["+"], seed=0)[0]
    {'prompt': '2+2=', 'answer': '4', 'a': '2', 'op': '+', 'b': '2'}
    """
    # Each named here: drawing no problem would only surface as train.prompts_per_step "more than the
    # 0 training examples", a key the user never touched.
    if num_examples < 1:
        fail("data.num_examples", num_examples, "must be at least 1")
    if max_operand < 0:
        fail("data.max_operand", max_operand, "must be >= 0 (operands are 0..max_operand)")
    if not operations:
        fail("data.operations", operations, f"must name at least one of {', '.join(OPERATIONS)}")
    unknown = [op for op in operations if op not in OPERATIONS]
    if unknown:
        raise GrpoError(f"data.operations: unknown {unknown}; choose from {list(OPERATIONS)}")
    operands = range(max_operand + 1)
    problems = list(itertools.product(operands, operations, operands))
    random.Random(seed).shuffle(problems)
    return [
        {"prompt": f"{a}{op}{b}=", "answer": str(OPERATIONS[op](a, b)), "a": str(a), "op": op, "b": str(b)}
        for a, op, b in problems[:num_examples]
    ]
