"""A model checkpoint as the engine sees it, read once: where it is, its shapes, its tokenizer.

Nothing in a checkpoint directory is ever executed: a checkpoint that asks for custom code
(``auto_map`` in ``config.json`` or ``tokenizer_config.json``) is refused, and the tokenizer is
loaded with ``trust_remote_code=False`` from local files only.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adarag.engine.provision import checkpoint_name, resolve_checkpoint
from adarag.engine.spec import (
    SUPPORTED_FAMILIES,
    ModelSpec,
    model_fingerprint,
    read_hf_config,
    weights_fingerprint,
)
from adarag.errors import MissingDependencyError, ModelLoadError

HASH_CACHE_FILE = "checkpoint_hashes.json"
"""The file in the home that keeps checkpoint files' hashes across processes."""

MAX_LAYERS = 1024
"""More layers than this in a ``config.json`` is a damaged or hostile file, not a model."""

_REMOTE_CODE_FILES = ("config.json", "tokenizer_config.json")


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
        """The model's name, e.g. ``SmolLM2-135M-Instruct`` (packaged profiles use it).

        The directory's name, or the repository's for a snapshot in the Hugging Face cache.
        """
        return checkpoint_name(self.path)

    def weights_fingerprint(self, cache_file: Path | None = None) -> str:
        """Digest of the weights alone (:func:`adarag.engine.spec.weights_fingerprint`).

        Args:
            cache_file: Where file hashes are kept across processes (None: this process only).

        Raises:
            OSError: A weights file cannot be read.
            ValueError: A weights file is not a safetensors file.
        """
        return weights_fingerprint(self.path, cache_file)

    @classmethod
    def open(cls, model: str, home: Path) -> Checkpoint:
        """Resolve an ``EngineConfig.model`` value (provisioning a named model once) and read it.

        Raises:
            ModelLoadError: The checkpoint is missing, incomplete, damaged, of an unsupported
                family, or asks for custom code.
        """
        path = resolve_checkpoint(model, home)
        refuse_remote_code(path)
        config = read_hf_config(path)
        try:
            spec = ModelSpec.from_hf_config(config)
        except ModelLoadError as err:
            if "; " in str(err):
                raise
            raise ModelLoadError(
                f"{path}: {err}; use a checkpoint of a supported family "
                f"({', '.join(SUPPORTED_FAMILIES)}) with full attention and full rotary embeddings"
            ) from err
        except (KeyError, TypeError, ValueError, OverflowError) as err:
            what = f"lacks {err}" if isinstance(err, KeyError) else f"has a bad value ({err})"
            raise ModelLoadError(
                f"{path / 'config.json'} {what}; use the config.json saved with the checkpoint"
            ) from err
        check_spec(spec, path)
        try:
            fingerprint = model_fingerprint(path, home / HASH_CACHE_FILE)
        except OSError as err:
            raise ModelLoadError(
                f"cannot read the checkpoint files of {path}: {err}; check the directory"
            ) from err
        return cls(path, spec, fingerprint, load_tokenizer(path))


def refuse_remote_code(path: Path) -> None:
    """Refuse a checkpoint whose config asks for custom Python code (never run here).

    Raises:
        ModelLoadError: ``config.json`` or ``tokenizer_config.json`` has an ``auto_map``.
    """
    for name in _REMOTE_CODE_FILES:
        file = path / name
        if not file.is_file():
            continue
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as err:
            raise ModelLoadError(
                f"cannot read {file}: {err}; use the file saved with the checkpoint"
            ) from err
        if not isinstance(data, dict):
            raise ModelLoadError(f"{file} is not a JSON object; use the file saved with the model")
        auto_map = data.get("auto_map")
        if auto_map:
            entries = auto_map if isinstance(auto_map, dict | list) else [auto_map]
            classes = ", ".join(sorted(str(entry) for entry in entries))[:200]
            raise ModelLoadError(
                f"{file} asks for custom code (auto_map: {classes}); adarag never runs code from "
                f"a checkpoint: use a checkpoint of a supported family "
                f"({', '.join(SUPPORTED_FAMILIES)}) without auto_map"
            )


def check_spec(spec: ModelSpec, path: Path) -> None:
    """Refuse shapes no real checkpoint has (before a model of that shape is built).

    Raises:
        ModelLoadError: A size is not positive, the heads do not group, or there are more than
            :data:`MAX_LAYERS` layers.
    """
    sizes = {
        "num_hidden_layers": spec.num_layers,
        "hidden_size": spec.hidden_size,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "intermediate_size": spec.intermediate_size,
        "vocab_size": spec.vocab_size,
        "max_position_embeddings": spec.max_position_embeddings,
    }
    problem = next((f"{name} is {value}" for name, value in sizes.items() if value < 1), None)
    if problem is None and spec.num_layers > MAX_LAYERS:
        problem = f"num_hidden_layers is {spec.num_layers} (more than {MAX_LAYERS})"
    if problem is None and spec.num_heads % spec.num_kv_heads:
        problem = (
            f"num_attention_heads ({spec.num_heads}) is not a multiple of num_key_value_heads "
            f"({spec.num_kv_heads})"
        )
    if problem is None and not (math.isfinite(spec.rms_norm_eps) and spec.rms_norm_eps > 0):
        problem = f"rms_norm_eps is {spec.rms_norm_eps}"
    if problem is None and not (math.isfinite(spec.rope.theta) and spec.rope.theta > 0):
        problem = f"rope_theta is {spec.rope.theta}"
    if problem is not None:
        raise ModelLoadError(
            f"{path / 'config.json'} is not a usable model configuration: {problem}; use the "
            "config.json saved with the checkpoint"
        )


def load_tokenizer(path: Path) -> Any:
    """The Hugging Face fast tokenizer saved in a checkpoint directory (no code run, offline).

    Raises:
        ModelLoadError: The tokenizer files are missing or damaged.
    """
    try:
        from transformers import AutoTokenizer
    except ImportError as err:
        raise MissingDependencyError("transformers", "all") from err
    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=False, local_files_only=True)
    except Exception as err:  # tokenizers and transformers raise many types for a bad file
        reason = " ".join(str(err).split())[:300] or type(err).__name__
        raise ModelLoadError(
            f"cannot load the tokenizer of {path}: {reason}; the directory needs the "
            "tokenizer files saved with the checkpoint (tokenizer.json, tokenizer_config.json)"
        ) from err
