"""Loading a safetensors checkpoint into adarag's :class:`DecoderModel`."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from adarag.engine.model import DecoderModel
from adarag.engine.spec import ModelSpec
from adarag.errors import ModelLoadError


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
