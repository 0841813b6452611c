"""A reward that presses Ctrl-C on a chosen call: an interrupt that lands while a step is scored."""

from __future__ import annotations

import os
import signal

INTERRUPT_AT_CALL = 0  # 0: never; set by the test, so the config stays identical between runs
calls = 0


def length_then_interrupt(prompts, completions, **_):
    global calls
    calls += 1
    if calls == INTERRUPT_AT_CALL:
        os.kill(os.getpid(), signal.SIGINT)  # delivered to the main thread, where this runs
    return [float(len(c)) for c in completions]
