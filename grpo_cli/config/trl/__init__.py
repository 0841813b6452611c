"""The TRL importer: every field of TRL's `GRPOConfig` and what it is in grpo.

`mapping` holds the table (its rows in `sampling_fields` and `training_fields`, a row's shape in
`field`), `values` the conversions that are more than a rename, `convert` applies the table to a
file's fields (`grpo train trl_config=FILE`, grpo_cli/commands/trl_config.py) and `page` writes the
table of docs/coming-from-trl.md. Nothing here needs TRL installed.
"""
