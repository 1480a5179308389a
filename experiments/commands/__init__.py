"""One module per ``memcores`` subcommand, each with ``add_arguments(parser)`` and ``run(args)``."""
