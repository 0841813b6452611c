"""`python -m grpo_cli` is `grpo`."""

from grpo_cli.cli import main

main()
