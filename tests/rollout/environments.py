"""Environments a user would write, imported by path (env.target=tests.rollout.environments:...)."""

from __future__ import annotations

import itertools
import time
from typing import Any


class EchoEnv:
    """grpo's protocol: answers each turn with a numbered user message; reward = turns taken."""

    def __init__(self, reply: str = "try again") -> None:
        self.reply, self.turns = reply, 0

    def reset(self, example: dict[str, Any]) -> str | None:
        self.turns = 0
        return None

    def step(self, completion: str) -> str | None:
        self.turns += 1
        return f"{self.reply} {self.turns}"

    def reward(self) -> float:
        return float(self.turns)


class BoardEnv(EchoEnv):
    """A reset that adds per-episode text (a board, a seed), as TRL `environment_factory` classes
    often do: every episode its own, so the rows of a group no longer share a prompt."""

    boards = itertools.count()

    def __init__(self, board: int = 0) -> None:
        super().__init__()
        self.board = board  # characters of board drawn before the state: a reset that makes prompts long

    def reset(self, example: dict[str, Any]) -> str | None:
        super().reset(example)
        return "." * self.board + f"state {next(BoardEnv.boards)}"


class FlakyEnv(EchoEnv):
    """Raises on the prompt "1+1=" and hangs on "2+2=": one row each, never the run."""

    def reset(self, example: dict[str, Any]) -> str | None:
        self.prompt = example["prompt"]
        return super().reset(example)

    def step(self, completion: str) -> str | None:
        if self.prompt == "1+1=":
            raise RuntimeError("the environment broke")
        if self.prompt == "2+2=":
            time.sleep(60)
        return super().step(completion)


class CounterEnv:
    """A TRL environment class as TRL's docs write one (environment_factory=CounterEnv)."""

    def __init__(self) -> None:
        self.counter = 0

    def reset(self, **kwargs: Any) -> str | None:
        self.counter = 0
        return f"The counter starts at 0; the answer is {kwargs.get('answer')}."

    def increment(self, step: int) -> int:
        """Add to the counter.

        Args:
            step: How much to add.

        Returns:
            The counter after the addition.
        """
        self.counter += step
        return self.counter

    def get_reward(self) -> float:
        return float(self.counter)


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b
