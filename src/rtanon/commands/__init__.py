"""One module per ``rtanon`` subcommand, each with ``register(subparsers)``."""
