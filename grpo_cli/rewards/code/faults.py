"""The two ways a sandboxed run can fail, kept apart because they score differently (docs/architecture.md §5)."""

from __future__ import annotations


class CandidateFailure(Exception):
    """The candidate failed: it raised, hung, crashed, hit a limit, broke the protocol, or returned
    something that is not plain data. Scores 0.

    `kind`: raised | syntax | missing | timeout | crashed | output_flood | protocol | non_strict | too_large.
    `exc_type`: for `raised`, the class name of what the candidate raised (untrusted text).
    `trace`: for `raised`, the candidate's own lines the exception passed through (untrusted text).
    """

    def __init__(self, message: str, kind: str = "failed", exc_type: str | None = None, trace: str = "") -> None:
        super().__init__(message)
        self.kind = kind
        self.exc_type = exc_type
        self.trace = trace


class HarnessFault(Exception):
    """The sandbox itself failed (no working backend, spawn failure, missing interpreter). Scores None."""
