"""How chunk KV is stored: in a float dtype, or in 8 bits with KIVI-style scales.

``int8`` quantises keys per channel (each layer, head and dimension gets its own min and scale
over the chunk's tokens: key outliers live in fixed channels) and values per token (each layer,
token and head over the head dimension), asymmetric, 255 levels, scales in float16 -- KIVI's
layout at 8 bits. A stored entry is a named tensor set; :meth:`KVCodec.decode` checks names,
dtypes and shapes before anything is served.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from adarag.kv import ChunkKV

StorageFormat = Literal["float32", "float16", "bfloat16", "int8"]
_LEVELS = 255
MAX_POSITIONS = 1 << 31
"""Positions an entry may span when the model's context is not given (int32 positions)."""


@dataclass(frozen=True)
class TokenLayout:
    """What every token of an entry holds: ``[num_layers, *, num_kv_heads, head_dim]``.

    ``max_positions`` is the model's context: an entry's tokens must lie within it.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    max_positions: int = MAX_POSITIONS


@dataclass(frozen=True)
class StoredKV:
    """One chunk's KV as stored: named tensors and the position it was computed at."""

    tensors: dict[str, torch.Tensor]
    start_position: int

    @property
    def nbytes(self) -> int:
        """Bytes held by the tensors."""
        return sum(t.element_size() * t.numel() for t in self.tensors.values())


class InvalidEntry(ValueError):
    """A stored entry whose tensors do not decode to this model's KV."""


class KVCodec:
    """Encodes chunk KV for storage and decodes (and checks) it for use.

    Args:
        storage: A float dtype name, or ``int8``.
        layout: The model's per-token layout every entry must have (unchecked when None).
    """

    def __init__(self, storage: StorageFormat, layout: TokenLayout | None = None) -> None:
        self.storage = storage
        self.layout = layout
        self.float_dtype = None if storage == "int8" else getattr(torch, storage)

    @property
    def tensor_names(self) -> frozenset[str]:
        """The names of an entry's tensors."""
        if self.float_dtype is not None:
            return frozenset({"k", "v"})
        return frozenset({"k_q", "k_min", "k_scale", "v_q", "v_min", "v_scale"})

    def encode(self, kv: ChunkKV) -> StoredKV:
        """The stored form of ``kv``."""
        if self.float_dtype is not None:
            k, v = kv.k.to(self.float_dtype).contiguous(), kv.v.to(self.float_dtype).contiguous()
            return StoredKV({"k": k, "v": v}, kv.start_position)
        k_q, k_min, k_scale = _quantize(kv.k, dim=1)  # per channel: over tokens
        v_q, v_min, v_scale = _quantize(kv.v, dim=3)  # per token: over the head dimension
        tensors = {"k_q": k_q, "k_min": k_min, "k_scale": k_scale}
        tensors |= {"v_q": v_q, "v_min": v_min, "v_scale": v_scale}
        return StoredKV(tensors, kv.start_position)

    def decode(self, stored: StoredKV) -> ChunkKV:
        """The KV of a stored entry (float entries as stored, int8 ones in float32).

        Raises:
            InvalidEntry: The tensors are not this codec's, or do not fit the model.
        """
        self.check(stored)
        tensors = stored.tensors
        if self.float_dtype is not None:
            return ChunkKV(tensors["k"], tensors["v"], stored.start_position)
        k = tensors["k_q"].float() * tensors["k_scale"].float() + tensors["k_min"].float()
        v = tensors["v_q"].float() * tensors["v_scale"].float() + tensors["v_min"].float()
        return ChunkKV(k, v, stored.start_position)

    def check(self, stored: StoredKV) -> None:
        """Names, dtypes and shapes of a stored entry (nothing is decoded).

        Raises:
            InvalidEntry: The tensors are not this codec's, or do not fit the model.
        """
        tensors = stored.tensors
        if set(tensors) != self.tensor_names:
            raise InvalidEntry(f"tensors {sorted(tensors)}, not {sorted(self.tensor_names)}")
        start = stored.start_position
        if start < 0:
            raise InvalidEntry(f"negative start position {start}")
        if self.float_dtype is not None:
            k, v = tensors["k"], tensors["v"]
            if k.dtype != self.float_dtype or v.dtype != self.float_dtype:
                raise InvalidEntry(f"dtype {k.dtype}/{v.dtype}, not {self.float_dtype}")
        else:
            k, v = tensors["k_q"], tensors["v_q"]
            _check_scales(k, tensors["k_min"], tensors["k_scale"], dim=1)
            _check_scales(v, tensors["v_min"], tensors["v_scale"], dim=3)
        if k.shape != v.shape or k.dim() != 4:
            raise InvalidEntry(f"shapes {tuple(k.shape)} and {tuple(v.shape)} are not one KV")
        layout = self.layout
        max_positions = MAX_POSITIONS if layout is None else layout.max_positions
        if start + k.shape[1] > max_positions:
            raise InvalidEntry(
                f"its {k.shape[1]} tokens at position {start} run past the model's "
                f"{max_positions} positions"
            )
        if layout is not None:
            expected = (layout.num_layers, layout.num_kv_heads, layout.head_dim)
            if (k.shape[0], k.shape[2], k.shape[3]) != expected:
                raise InvalidEntry(f"shape {tuple(k.shape)} does not fit the model's {layout}")


def _quantize(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric 8-bit codes of ``x``, with a min and scale per slice reduced over ``dim``."""
    x = x.float()
    low = x.amin(dim=dim, keepdim=True)
    scale = (x.amax(dim=dim, keepdim=True) - low) / _LEVELS
    scale16 = scale.to(torch.float16).clamp_min(torch.finfo(torch.float16).tiny)
    low16 = low.to(torch.float16)
    codes = ((x - low16.float()) / scale16.float()).round_().clamp_(0, _LEVELS)
    return codes.to(torch.uint8), low16, scale16


def _check_scales(codes: torch.Tensor, low: torch.Tensor, scale: torch.Tensor, dim: int) -> None:
    if codes.dtype != torch.uint8 or low.dtype != torch.float16 or scale.dtype != torch.float16:
        raise InvalidEntry(f"int8 entry with dtypes {codes.dtype}/{low.dtype}/{scale.dtype}")
    if codes.dim() != 4:
        raise InvalidEntry(f"int8 codes of shape {tuple(codes.shape)}")
    expected = list(codes.shape)
    expected[dim] = 1
    if list(low.shape) != expected or list(scale.shape) != expected:
        raise InvalidEntry(f"int8 scales of shape {tuple(scale.shape)} for {tuple(codes.shape)}")
