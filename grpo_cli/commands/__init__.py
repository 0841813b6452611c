"""One small module per subcommand: compose the config, run the stages, print and write files."""
