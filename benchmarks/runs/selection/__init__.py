"""``selection.py``'s subcommands: a screen of selection signals, and uncertainty routing."""
