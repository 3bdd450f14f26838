"""A model checkpoint as the engine sees it, read once: where it is, its shapes, its tokenizer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adarag.engine.provision import resolve_checkpoint
from adarag.engine.spec import ModelSpec, model_fingerprint, read_hf_config
from adarag.errors import MissingDependencyError


@dataclass(frozen=True)
class Checkpoint:
    """A local Hugging Face checkpoint directory, resolved and read once.

    Attributes:
        path: The checkpoint directory (safetensors weights, ``config.json``, tokenizer).
        spec: Its architecture facts.
        fingerprint: Digest of the checkpoint (part of every cache key).
        tokenizer: Its Hugging Face fast tokenizer.
    """

    path: Path
    spec: ModelSpec
    fingerprint: str
    tokenizer: Any

    @property
    def name(self) -> str:
        """The directory's name, e.g. ``SmolLM2-135M-Instruct`` (packaged profiles use it)."""
        return self.path.name

    @classmethod
    def open(cls, model: str, home: Path) -> Checkpoint:
        """Resolve an ``EngineConfig.model`` value (provisioning a named model once) and read it.

        Raises:
            ModelLoadError: The checkpoint is missing, incomplete or of an unsupported family.
        """
        path = resolve_checkpoint(model, home)
        spec = ModelSpec.from_hf_config(read_hf_config(path))
        return cls(path, spec, model_fingerprint(path), load_tokenizer(path))


def load_tokenizer(path: Path) -> Any:
    """The Hugging Face fast tokenizer saved in a checkpoint directory."""
    try:
        from transformers import AutoTokenizer
    except ImportError as err:
        raise MissingDependencyError("transformers", "all") from err
    return AutoTokenizer.from_pretrained(path)
