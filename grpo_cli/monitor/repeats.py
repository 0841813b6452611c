"""Which alerts the console prints: an alert that fires step after step (dynamic sampling short of
groups, a function returning NaN on every batch) is said the first time, then at its 10th, 100th,
1000th... repeat with its count, and once more at the end as a summary. A wall of identical lines
hides the one alert that is new; train.log keeps every alert, one line each.

Two alerts repeat one another when they differ only in their numbers ("5 group(s)" and "14
group(s)"): the same condition, measured again. Different words are a different alert, said at once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# a number standing alone: not the digits of a name ('format_v1', 'step_000020', 'gpt2'), which tell
# two alerts apart
NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?%?(?!\w|\.\d)", re.IGNORECASE)
SAY_AGAIN_EVERY = 10  # a repeat is printed at the 10th, 100th, 1000th... occurrence: a few lines per run


def alert_kind(alert: str) -> str:
    """The alert with its numbers blanked: what stays the same while the condition repeats.

    >>> alert_kind("dynamic sampling: 5 group(s) after 4 draw(s), 0.25 of them")
    'dynamic sampling: # group(s) after # draw(s), # of them'
    >>> alert_kind("reward 'format_v1' masked after 3 failed batches: -1.5e-3, 40%, last 0.5.")
    "reward 'format_v1' masked after # failed batches: #, #, last #."
    """
    return NUMBER.sub("#", alert)


@dataclass
class Repeats:
    """One kind of alert: how often it fired, first and last at which step."""

    count: int
    first_step: int
    last_step: int
    last_text: str
    shown: int = 1  # occurrences printed; the rest are in train.log


class AlertRepeats:
    """Decides, alert by alert, whether the console prints it and with what note."""

    def __init__(self, every: int = SAY_AGAIN_EVERY) -> None:
        self.every = every
        self.kinds: dict[str, Repeats] = {}

    def note(self, step: int, alert: str) -> str | None:
        """The line's note if this occurrence is printed ("" for a first one), None to keep it quiet.

        >>> r = AlertRepeats(every=3)
        >>> [r.note(s, f"short by {s}") for s in range(1, 11)]
        ['', None, ', 3rd time since step 1', None, None, None, None, None, ', 9th time since step 1', None]
        """
        kind = alert_kind(alert)
        seen = self.kinds.get(kind)
        if seen is None:
            self.kinds[kind] = Repeats(1, step, step, alert)
            return ""
        seen.count, seen.last_step, seen.last_text = seen.count + 1, step, alert
        if not _is_power(seen.count, self.every):
            return None
        seen.shown += 1
        return f", {_ordinal(seen.count)} time since step {seen.first_step}"

    def summary(self) -> list[str]:
        """One line per alert that repeated quietly: how often, over which steps, the last wording."""
        return [
            f"alert repeated {r.count} times, steps {r.first_step}-{r.last_step} ({r.count - r.shown} not printed; "
            f"every one is in train.log), the last: {r.last_text}"
            for r in self.kinds.values()
            if r.count > r.shown
        ]


def _is_power(count: int, base: int) -> bool:
    while count % base == 0 and count > 1:
        count //= base
    return count == 1


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
