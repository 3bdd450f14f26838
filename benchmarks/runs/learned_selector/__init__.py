"""``learned_selector.py``'s subcommands: the learned selector's features, and what it buys."""
