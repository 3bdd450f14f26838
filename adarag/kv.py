"""The unit of cached KV: one chunk's keys and values for every layer.

A bottom-layer value type: the engine computes and consumes it, the cache stores it, and neither
needs the other for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ChunkKV:
    """KV of one prompt segment, keys after RoPE at ``start_position + i``.

    Attributes:
        k: [num_layers, num_tokens, num_kv_heads, head_dim].
        v: [num_layers, num_tokens, num_kv_heads, head_dim].
        start_position: Absolute position of the first token when the KV was computed.
    """

    k: torch.Tensor
    v: torch.Tensor
    start_position: int

    def __post_init__(self) -> None:
        assert self.k.shape == self.v.shape, f"k {self.k.shape} and v {self.v.shape} differ"
        assert self.k.dim() == 4, f"expected [layers, tokens, heads, dim], got {self.k.shape}"

    @property
    def num_tokens(self) -> int:
        """Tokens in the segment."""
        return int(self.k.shape[1])

    @property
    def nbytes(self) -> int:
        """Bytes held by k and v."""
        return self.k.element_size() * self.k.numel() * 2

    def to(self, dtype: torch.dtype) -> ChunkKV:
        """The same entry in another dtype (no copy when it already has it)."""
        if self.k.dtype == dtype:
            return self
        return ChunkKV(self.k.to(dtype), self.v.to(dtype), self.start_position)
