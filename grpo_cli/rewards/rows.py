"""One completion at a time: a reward that loops over completions isolates each one.

A single completion can break a scorer (pycodestyle raises IndexError on a program whose first
statement is `B #x`). Raised out of the loop, it cost the whole batch: 128 scores turned NaN for
one. `score_each` scores every row on its own; a row that raises scores None (NaN in the fusion),
and its error travels with the scores, so the executor and the fusion report it with a count
instead of dropping it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any


def describe(err: BaseException) -> str:
    """An exception as one line: its type, and its message when it has one."""
    text = str(err)
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


class RowScores(list):
    """A reward's scores, a plain list to every caller, carrying the rows that raised (row -> error)."""

    def __init__(self, values: Iterable[float | None] = (), row_errors: dict[int, str] | None = None) -> None:
        super().__init__(values)
        self.row_errors: dict[int, str] = dict(row_errors or {})


def score_each(score: Callable[..., float | None], *columns: Iterable[Any]) -> RowScores:
    """`score(*row)` for each row of the zipped columns; a row that raises scores None.

    For your own rewards too: `return score_each(my_score, completions, answer)`.

    >>> scores = score_each(lambda c, a: float(int(c) == a), ["1", "x", "3"], [1, 2, 2])
    >>> scores, scores.row_errors
    ([1.0, None, 0.0], {1: "ValueError: invalid literal for int() with base 10: 'x'"})
    """
    values: list[float | None] = []
    row_errors: dict[int, str] = {}
    for i, row in enumerate(zip(*columns)):
        try:
            values.append(score(*row))
        except Exception as err:  # this completion's, not the batch's: the others keep their scores
            values.append(None)
            row_errors[i] = describe(err)
    return RowScores(values, row_errors)
