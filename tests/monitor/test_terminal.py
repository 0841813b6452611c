"""Every command's stderr console prints user text as written."""

from __future__ import annotations

from rich.markup import escape

from grpo_cli.monitor.terminal import stderr_console


def test_a_reward_target_with_colons_prints_as_written_not_as_an_emoji() -> None:
    console = stderr_console(width=200)
    with console.capture() as captured:
        console.print(f"reward target {escape('my.mod:b:fn')} [dim]{escape('[x]')}[/dim]")
    assert captured.get().strip() == "reward target my.mod:b:fn [x]"
