"""The ``rtanon train`` and ``rtanon lab`` subcommands (argparse only at registration)."""
