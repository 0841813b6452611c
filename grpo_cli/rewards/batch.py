"""RewardBatch: what every reward function sees, built the same way for train, score and eval.

Before this type, the trainer and `grpo score` each assembled prompts, columns and lengths on
their own, and drifted (score passed characters where training passed tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

COMPLETION_LENGTHS = "completion_lengths"  # the column of token counts every reward may read
COMPLETION_IDS = "completion_ids"  # each completion's sampled token ids: only for a function that names it


@dataclass
class RewardBatch:
    """prompts × G completions laid out group by group (G consecutive completions share a prompt).

    `columns` hold one value per completion: each data column of the prompt's row, repeated G
    times, plus `completion_lengths` in tokens (EOS included), which the `overlong` reward reads
    (None only where a rollouts file gives no `token_count` and no tokenizer was set to count).

    >>> batch = RewardBatch.from_groups([{"prompt": "1+1=", "answer": "2"}], ["2", "3"], [2, 1], 2)
    >>> batch.prompts, batch.columns
    (['1+1=', '1+1='], {'answer': ['2', '2'], 'completion_lengths': [2, 1]})
    """

    prompts: list[Any]
    completions: list[str]
    columns: dict[str, list[Any]]
    group_size: int

    @classmethod
    def from_groups(
        cls,
        rows: Sequence[dict[str, Any]],
        completions: Sequence[str],
        completion_lengths: Sequence[int | None],
        group_size: int,
        exclude: Sequence[str] = (),
        completion_ids: Sequence[list[int]] | None = None,
    ) -> RewardBatch:
        """`rows`: one dataset row per prompt (`prompt` plus its columns; keys in `exclude`, such as
        a rollouts file's `completions`, are not columns). Rows may differ in their columns: a
        row without one gives None there. `completion_ids`, when known (training's rollouts), become
        the column TRL's reward functions read."""
        if len(completions) != len(rows) * group_size or len(completion_lengths) != len(completions):
            raise ValueError(
                f"{len(rows)} prompts x {group_size} need {len(rows) * group_size} completions and lengths, "
                f"got {len(completions)} and {len(completion_lengths)}"
            )
        skip = {"prompt", COMPLETION_LENGTHS, COMPLETION_IDS, *exclude}
        names = list(dict.fromkeys(k for row in rows for k in row if k not in skip))
        columns = {name: [row.get(name) for row in rows for _ in range(group_size)] for name in names}
        columns[COMPLETION_LENGTHS] = [None if n is None else int(n) for n in completion_lengths]
        if completion_ids is not None:
            columns[COMPLETION_IDS] = [list(ids) for ids in completion_ids]
        prompts = [row["prompt"] for row in rows for _ in range(group_size)]
        return cls(prompts, list(completions), columns, group_size)

    def __len__(self) -> int:
        return len(self.completions)
