"""Code rewards and the sandbox they run candidates in (DESIGN.md §3, §6)."""

from grpo_cli.rewards.code.sandbox import (
    CandidateFailure,
    HarnessFault,
    ProgramResult,
    Sandbox,
    SandboxConfig,
    Session,
)

__all__ = ["CandidateFailure", "HarnessFault", "ProgramResult", "Sandbox", "SandboxConfig", "Session"]
