"""adarag: faster RAG through chunk-KV reuse with selective recomputation (AdaCache).

The public names are imported on first use (PEP 562), so ``import adarag.config`` or the
``adarag`` command's argument checks run without loading torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from adarag.config import AdaRagConfig
    from adarag.errors import AdaRagError, ConfigError, InputError, ModelLoadError
    from adarag.pipeline import AdaRAG, AnswerStream, AsyncAnswerStream
    from adarag.retrievers import MemoryRetriever, Retriever
    from adarag.schema import Answer, Chunk, GenerationParams, PromptLayout, QueryTrace, StepTrace

_PUBLIC_MODULES = {
    "adarag.config": ("AdaRagConfig",),
    "adarag.errors": ("AdaRagError", "ConfigError", "InputError", "ModelLoadError"),
    "adarag.pipeline": ("AdaRAG", "AnswerStream", "AsyncAnswerStream"),
    "adarag.retrievers": ("MemoryRetriever", "Retriever"),
    "adarag.schema": (
        "Answer",
        "Chunk",
        "GenerationParams",
        "PromptLayout",
        "QueryTrace",
        "StepTrace",
    ),
}
_MODULE_OF = {name: module for module, names in _PUBLIC_MODULES.items() for name in names}

__all__ = [
    "AdaRAG",
    "AnswerStream",
    "AsyncAnswerStream",
    "MemoryRetriever",
    "Retriever",
    "AdaRagConfig",
    "AdaRagError",
    "Answer",
    "Chunk",
    "ConfigError",
    "GenerationParams",
    "InputError",
    "ModelLoadError",
    "PromptLayout",
    "QueryTrace",
    "StepTrace",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'adarag' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
