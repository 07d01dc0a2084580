"""The command line's commands, one module per group; rsieve_cli.app registers them."""
