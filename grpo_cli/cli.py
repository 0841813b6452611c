"""`grpo SUBCOMMAND [hydra args]`: dispatch only."""

from __future__ import annotations

import difflib
import importlib
import sys

from grpo_cli import __version__

SUBCOMMANDS = {
    "train": ("grpo_cli.commands.train", "GRPO training: rollout, score, advantage, update"),
    "score": ("grpo_cli.commands.score", "score a rollouts jsonl: per-function rewards, fused reward, advantages"),
}
USAGE = "usage: grpo SUBCOMMAND [overrides] [hydra options]"


def _print_help() -> None:
    print(f"grpo {__version__}: GRPO post-training of causal language models\n\n{USAGE}\n\nsubcommands:")
    for name, (_, text) in SUBCOMMANDS.items():
        print(f"  {name:<10} {text}")
    print("\n`grpo SUBCOMMAND --help` lists its config groups and keys.")


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        _print_help()
        sys.exit(0 if argv else 2)
    if argv[0] == "--version":
        print(__version__)
        return
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        close = difflib.get_close_matches(name, SUBCOMMANDS, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        print(f"grpo: unknown subcommand '{name}'{hint}\n{USAGE}", file=sys.stderr)
        sys.exit(2)
    from grpo_cli.commands.errors import report_user_errors
    from grpo_cli.commands.overrides import check_overrides
    from grpo_cli.config.schema import ScoreConfig, TrainConfig

    schema = {"train": TrainConfig, "score": ScoreConfig}[name]
    report_user_errors(lambda: check_overrides(rest, schema))
    sys.argv = [f"grpo-{name}", *rest]
    importlib.import_module(SUBCOMMANDS[name][0]).main()
