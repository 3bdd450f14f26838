"""Loading a safetensors checkpoint into adarag's :class:`DecoderModel`."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from adarag.engine.model import DecoderModel, pack_for_cpu
from adarag.engine.spec import ModelSpec
from adarag.errors import ModelLoadError


def load_model(path: Path, spec: ModelSpec, dtype: torch.dtype, device: str) -> DecoderModel:
    """Build a :class:`DecoderModel` and load its safetensors weights.

    Only safetensors files are read: nothing in the checkpoint is unpickled or executed.

    Raises:
        ModelLoadError: A weights file is damaged, or a weight is missing, unexpected, not a
            floating-point tensor, or has the wrong shape.
    """
    checkpoint: dict[str, torch.Tensor] = {}
    for weights in sorted(path.glob("*.safetensors")):
        try:
            checkpoint.update(load_file(weights, device="cpu"))
        except (SafetensorError, OSError, ValueError, RuntimeError) as err:
            reason = " ".join(str(err).split())[:200]
            raise ModelLoadError(
                f"{weights} is not a readable safetensors file ({reason}); re-save or re-copy "
                "the checkpoint"
            ) from err
    return model_from_state(checkpoint, spec, dtype, device, f"checkpoint {path}")


def model_from_state(
    checkpoint: dict[str, torch.Tensor],
    spec: ModelSpec,
    dtype: torch.dtype,
    device: str,
    origin: str = "the state dict",
) -> DecoderModel:
    """Build a :class:`DecoderModel` from Hugging Face-named weights (already in memory).

    ``origin`` names where the weights came from in errors. Weights already in ``dtype`` on
    ``device`` are used as they are (q/k/v and gate/up are fused into new tensors).

    Raises:
        ModelLoadError: A weight is missing, unexpected, not floating-point or misshapen.
    """
    not_float = sorted(name for name, w in checkpoint.items() if not w.is_floating_point())
    if not_float:
        raise ModelLoadError(
            f"{origin} has weights that are not floating-point tensors ({not_float[:3]}); "
            "use a float16, bfloat16 or float32 checkpoint"
        )
    try:
        state = _rename_checkpoint_keys(checkpoint, spec)
    except RuntimeError as err:
        raise ModelLoadError(
            f"{origin} has weights of the wrong shape ({_one_line(err)}); use the "
            "config.json saved with these weights"
        ) from err
    with torch.device("meta"):
        model = DecoderModel(spec)
    _check_matches(model, state, spec, origin)
    try:
        model.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as err:
        raise ModelLoadError(
            f"{origin} has weights that do not load ({_one_line(err)}); use the "
            "config.json saved with these weights"
        ) from err
    if spec.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
    pack_for_cpu(model)
    return model


def _check_matches(
    model: DecoderModel, state: dict[str, torch.Tensor], spec: ModelSpec, origin: str
) -> None:
    """Refuses renamed weights that are missing, unexpected or misshapen for ``model``.

    Raises:
        ModelLoadError: A weight is missing, unexpected or of the wrong shape.
    """
    shapes = {name: tuple(param.shape) for name, param in model.named_parameters()}
    missing, unexpected = shapes.keys() - state.keys(), state.keys() - shapes.keys()
    if missing or unexpected:
        raise ModelLoadError(
            f"{origin} does not match a {spec.family} model: missing "
            f"{sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}; use the config.json "
            "saved with these weights"
        )
    wrong = [
        f"{name} is {list(state[name].shape)}, not {list(shape)}"
        for name, shape in shapes.items()
        if tuple(state[name].shape) != shape
    ]
    if wrong:
        raise ModelLoadError(
            f"{origin} has weights of the wrong shape for its config.json "
            f"({'; '.join(wrong[:3])}{', ...' if len(wrong) > 3 else ''}); use the config.json "
            "saved with these weights"
        )


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:300]


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
