"""The architecture facts of a supported model family, read from a Hugging Face config."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adarag.errors import ModelLoadError

logger = logging.getLogger(__name__)

SUPPORTED_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
"""HF ``model_type`` values the engine runs: pre-norm decoders with RoPE, GQA and SwiGLU."""

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeSpec:
    """Rotary embedding parameters (no attention scaling: delta rotations stay exact)."""

    theta: float
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelSpec:
    """Shapes and per-family switches of a decoder-only model."""

    family: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope: RopeSpec
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    eos_token_ids: tuple[int, ...]

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> ModelSpec:
        """Build a spec from the parsed ``config.json`` of a checkpoint.

        Raises:
            ModelLoadError: The family, RoPE variant or attention layout is not supported.
        """
        family = config.get("model_type")
        if family not in SUPPORTED_FAMILIES:
            raise ModelLoadError(
                f"model family {family!r} is not supported; supported families: "
                f"{', '.join(SUPPORTED_FAMILIES)}"
            )
        window = config.get("sliding_window")
        use_window = config.get("use_sliding_window", family == "mistral")
        max_positions = int(config.get("max_position_embeddings", 4096))
        if window is not None and use_window and int(window) < max_positions:
            raise ModelLoadError(
                f"sliding-window attention (window {window}) is not supported; use a checkpoint "
                "with full attention"
            )
        hidden_size = int(config["hidden_size"])
        num_heads = int(config["num_attention_heads"])
        eos = config.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        return cls(
            family=family,
            num_layers=int(config["num_hidden_layers"]),
            hidden_size=hidden_size,
            num_heads=num_heads,
            num_kv_heads=int(config.get("num_key_value_heads") or num_heads),
            head_dim=int(config.get("head_dim") or hidden_size // num_heads),
            intermediate_size=int(config["intermediate_size"]),
            vocab_size=int(config["vocab_size"]),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope=_rope_spec(config),
            max_position_embeddings=max_positions,
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=family == "qwen2" or bool(config.get("attention_bias", False)),
            qk_norm=family == "qwen3",
            eos_token_ids=eos_ids,
        )


def read_hf_config(path: Path) -> dict[str, Any]:
    """Parse ``path/config.json``.

    Raises:
        ModelLoadError: The directory holds no readable ``config.json``.
    """
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(
            f"{path} is not a Hugging Face checkpoint directory: it has no config.json"
        )
    try:
        return dict(json.loads(config_file.read_text()))
    except (OSError, json.JSONDecodeError) as err:
        raise ModelLoadError(f"cannot read {config_file}: {err}") from err


def model_fingerprint(path: Path, cache_file: Path | None = None) -> str:
    """A short digest of the checkpoint: ``config.json`` and every byte of every weights file.

    Each safetensors file is hashed whole (SHA-256), so any edited weight -- one matrix negated
    -- gives another fingerprint, hence another KV namespace. A file's hash is reused while its
    size, modification and change times and inode are unchanged: in this process, and across
    processes through ``cache_file`` (a JSON file; None: hashed once per process).

    Raises:
        OSError: A file cannot be read.
    """
    digest = hashlib.sha256((path / "config.json").read_bytes())
    cached = _read_hash_cache(cache_file)
    updated = False
    for weights in sorted(path.glob("*.safetensors")):
        info = weights.stat()
        identity = f"{info.st_size}:{info.st_mtime_ns}:{info.st_ctime_ns}:{info.st_ino}"
        resolved = str(weights.resolve())
        entry = cached.get(resolved)
        if isinstance(entry, dict) and entry.get("identity") == identity:
            file_hash = str(entry.get("sha256"))
        else:
            file_hash = _file_sha256(resolved, identity)
            cached[resolved] = {"identity": identity, "sha256": file_hash}
            updated = True
        digest.update(f"{weights.name}:{info.st_size}:{file_hash}".encode())
    if updated and cache_file is not None:
        _write_hash_cache(cache_file, cached)
    return digest.hexdigest()[:16]


def weights_fingerprint(path: Path, cache_file: Path | None = None) -> str:
    """A short digest of the weights alone: every tensor's name, dtype, shape and bytes.

    Unlike :func:`model_fingerprint` it does not depend on ``config.json``, the directory's name,
    how the tensors are ordered or split into files, or the files' metadata, so the same weights
    saved by another transformers version (or renamed, or re-sharded) keep it. Packaged profiles
    are found by it. Hashes are reused as :func:`model_fingerprint` reuses them.

    Raises:
        OSError: A file cannot be read.
        ValueError: A file is not a safetensors file.
    """
    cached = _read_hash_cache(cache_file)
    updated = False
    tensors: dict[str, str] = {}
    for weights in sorted(path.glob("*.safetensors")):
        info = weights.stat()
        identity = f"{info.st_size}:{info.st_mtime_ns}:{info.st_ctime_ns}:{info.st_ino}"
        key = f"tensors:{weights.resolve()}"
        entry = cached.get(key)
        if isinstance(entry, dict) and entry.get("identity") == identity:
            file_tensors = dict(entry.get("tensors") or {})
        else:
            file_tensors = _tensor_sha256s(weights)
            cached[key] = {"identity": identity, "tensors": file_tensors}
            updated = True
        tensors.update(file_tensors)
    if updated and cache_file is not None:
        _write_hash_cache(cache_file, cached)
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(f"{name}={tensors[name]}\n".encode())
    return digest.hexdigest()[:16]


MAX_SAFETENSORS_HEADER_BYTES = 100 * 1024 * 1024
"""A safetensors header larger than this is a damaged file (the format's own limit)."""


def _tensor_sha256s(path: Path) -> dict[str, str]:
    """``dtype:shape:sha256`` of each tensor of a safetensors file, by name (read in file order)."""
    with path.open("rb") as handle:
        header_bytes = int.from_bytes(handle.read(8), "little")
        if not 0 < header_bytes <= MAX_SAFETENSORS_HEADER_BYTES:
            raise ValueError(f"{path} is not a safetensors file (header of {header_bytes} bytes)")
        try:
            header = dict(json.loads(handle.read(header_bytes)))
            entries = sorted(
                (
                    (name, str(meta["dtype"]), list(meta["shape"]), *map(int, meta["data_offsets"]))
                    for name, meta in header.items()
                    if name != "__metadata__"
                ),
                key=lambda entry: entry[3],
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{path} has a damaged safetensors header ({err})") from err
        digests: dict[str, str] = {}
        for name, dtype, shape, start, end in entries:
            handle.seek(8 + header_bytes + start)
            hasher = hashlib.sha256()
            remaining = end - start
            while remaining > 0:
                block = handle.read(min(remaining, 1 << 24))
                if not block:
                    raise ValueError(f"{path} is truncated (tensor {name})")
                hasher.update(block)
                remaining -= len(block)
            digests[name] = f"{dtype}:{shape}:{hasher.hexdigest()}"
    return digests


@functools.lru_cache(maxsize=64)
def _file_sha256(path: str, identity: str) -> str:
    """SHA-256 of a file's bytes (``identity``: its size, times and inode, the memo's key)."""
    hasher = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 24):
            hasher.update(block)
    return hasher.hexdigest()


def _read_hash_cache(cache_file: Path | None) -> dict[str, Any]:
    if cache_file is None:
        return {}
    try:
        data = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        return {}  # missing or damaged: the files are hashed again
    return data if isinstance(data, dict) else {}


def _write_hash_cache(cache_file: Path, cached: dict[str, Any]) -> None:
    staging = cache_file.with_name(f".{cache_file.name}.{os.getpid()}.tmp")
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        staging.write_text(json.dumps(cached, indent=1))
        os.replace(staging, cache_file)
    except OSError as err:  # a read-only home: hashed again next time
        logger.debug("cannot write the checkpoint hash cache %s (%s)", cache_file, err)
        staging.unlink(missing_ok=True)


def _rope_spec(config: dict[str, Any]) -> RopeSpec:
    # transformers >= 5 writes `rope_parameters`; older checkpoints `rope_theta` + `rope_scaling`.
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", config.get("rope_theta", 10000.0)))
    rope_type = str(params.get("rope_type", params.get("type", "default")))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ModelLoadError(
            f"RoPE type {rope_type!r} is not supported; supported: "
            f"{', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    if float(config.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ModelLoadError("partial rotary embeddings are not supported")
    return RopeSpec(
        theta=theta,
        rope_type=rope_type,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(
            params.get(
                "original_max_position_embeddings", config.get("max_position_embeddings", 8192)
            )
        ),
    )
