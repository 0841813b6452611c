"""The schema's sections, one module per area of config keys; `config.schema` composes them into each
command's config and re-exports every name."""
