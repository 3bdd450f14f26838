"""``traffic.py``'s subcommands: cache reuse under traffic."""
