"""Code rewards and the sandbox they run candidates in (docs/architecture.md §3, §5).

`SandboxConfig` is the `sandbox.*` config section's class (grpo_cli.config.schema), re-exported.
"""

from grpo_cli.rewards.code.sandbox import (
    CandidateFailure,
    HarnessFault,
    ProgramResult,
    Sandbox,
    SandboxConfig,
    Session,
)

__all__ = ["CandidateFailure", "HarnessFault", "ProgramResult", "Sandbox", "SandboxConfig", "Session"]
