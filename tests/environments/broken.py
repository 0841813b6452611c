"""Environments a user might write that go wrong (env.target=tests.environments.broken:...)."""

from __future__ import annotations

import threading
from typing import Any


class ResetFails:
    """A TRL environment class whose reset raises on every row (a service that is down)."""

    def reset(self, **kwargs: Any) -> str | None:
        raise RuntimeError("the board service is down")

    def get_reward(self) -> float:
        return 1.0


class RewardFails:
    """A TRL environment class whose get_reward raises on every row."""

    def reset(self, **kwargs: Any) -> str | None:
        return None

    def get_reward(self) -> float:
        raise RuntimeError("the scorer is down")


class EveryOtherResetFails:
    """grpo's protocol: the reset of every second environment built raises; the others answer once."""

    built = 0
    lock = threading.Lock()

    def __init__(self) -> None:
        with EveryOtherResetFails.lock:
            EveryOtherResetFails.built += 1
            self.fails = EveryOtherResetFails.built % 2 == 0

    def reset(self, example: dict[str, Any]) -> str | None:
        if self.fails:
            raise RuntimeError("no board for this row")
        return None

    def step(self, completion: str) -> str | None:
        return None


class NoReset:
    """A TRL-style class without reset (TRL calls reset before every episode)."""

    def get_reward(self) -> float:
        return 1.0


class NeedsArguments:
    """A class whose __init__ needs an argument that env=trl never passes."""

    def __init__(self, size: int) -> None:
        self.size = size

    def reset(self, **kwargs: Any) -> str | None:
        return None

    def step(self, completion: str) -> str | None:
        return None


class AnswerReset:
    """A TRL environment class whose reset takes the row's `answer` column by keyword, as TRL passes it."""

    def reset(self, answer: str) -> str:
        self.answer = answer
        return f"the answer is {answer}"

    def get_reward(self) -> float:
        return 1.0
