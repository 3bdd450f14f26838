"""``fidelity.py``'s subcommands: fused KV against full recomputation."""
