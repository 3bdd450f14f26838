"""``storage.py``'s subcommands: what chunk KV costs to store, share and build."""
