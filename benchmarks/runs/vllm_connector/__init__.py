"""``vllm_connector.py``'s subcommands: adarag's vLLM connector, in process and served."""

from __future__ import annotations

from common import RESULTS

OUTPUT = RESULTS / "vllm"
