"""A seeded arithmetic task: small enough that a tiny model learns it on a CPU in minutes."""

from __future__ import annotations

import itertools
import operator
import random

OPERATIONS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def arithmetic_examples(num_examples: int, max_operand: int, operations: list[str], seed: int) -> list[dict[str, str]]:
    """Distinct problems `a<op>b=` with their answers, shuffled by `seed`.

    Problems are distinct so the held-out eval split never repeats a training prompt. The operands
    and the operator are columns too, so `data.template` can phrase the problem for an instruct model.

    >>> arithmetic_examples(2, 3, ["+"], seed=0)[0]
    {'prompt': '2+2=', 'answer': '4', 'a': '2', 'op': '+', 'b': '2'}
    """
    unknown = [op for op in operations if op not in OPERATIONS]
    if unknown:
        from grpo_cli.errors import GrpoError

        raise GrpoError(f"data.operations: unknown {unknown}; choose from {list(OPERATIONS)}")
    operands = range(max_operand + 1)
    problems = list(itertools.product(operands, operations, operands))
    random.Random(seed).shuffle(problems)
    return [
        {"prompt": f"{a}{op}{b}=", "answer": str(OPERATIONS[op](a, b)), "a": str(a), "op": op, "b": str(b)}
        for a, op, b in problems[:num_examples]
    ]
