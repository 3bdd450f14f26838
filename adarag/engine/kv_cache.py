"""The fused KV cache of one sequence, allocated once per request with room to decode."""

from __future__ import annotations

import torch

from adarag.kernels import Backend, rope_delta
from adarag.kv import ChunkKV


class KVCache:
    """Keys and values of every layer: ``k, v [num_layers, capacity, num_kv_heads, head_dim]``.

    Row ``j`` holds absolute position ``j``; ``length`` rows are filled. The memory is laid out
    head-major (``[num_layers, num_kv_heads, capacity, head_dim]``; ``k`` and ``v`` are views
    of it in token order), so one head's keys of one layer are one contiguous block: attention
    reads them without a copy, which halves the time a decoding step spends in attention.
    """

    def __init__(
        self,
        num_layers: int,
        capacity: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        shape = (num_layers, num_kv_heads, capacity, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device).transpose(1, 2)
        self.v = torch.zeros(shape, dtype=dtype, device=device).transpose(1, 2)
        self.length = 0
        self.key_bias: torch.Tensor | None = None
        """[num_layers, capacity] float added to every query's logit of each key (attention
        rescaling of reused rows), or None: no bias."""

    @property
    def capacity(self) -> int:
        """Rows allocated."""
        return int(self.k.shape[1])

    def load(
        self, start: int, chunk: ChunkKV, inv_freq: torch.Tensor, backend: Backend = "auto"
    ) -> None:
        """Copy a chunk's KV to rows ``start..`` re-rotating its keys from where they were stored.

        Args:
            start: Target position of the chunk's first token.
            chunk: Cached KV; its keys carry RoPE of ``chunk.start_position + i``.
            inv_freq: [head_dim // 2] RoPE inverse frequencies.
            backend: Kernel backend for the re-rotation.
        """
        end = start + chunk.num_tokens
        assert end <= self.capacity, f"chunk ends at {end}, capacity {self.capacity}"
        keys = chunk.k.to(self.k.dtype)
        shift = start - chunk.start_position
        if shift != 0:
            delta = torch.full((chunk.num_tokens,), shift, dtype=torch.int64, device=keys.device)
            keys = rope_delta(keys, delta, inv_freq, backend=backend)
        self.k[:, start:end] = keys
        self.v[:, start:end] = chunk.v.to(self.v.dtype)

    def segment(self, start: int, end: int) -> ChunkKV:
        """A copy of rows ``start..end`` as a cacheable chunk entry (token-major, contiguous)."""
        assert 0 <= start < end <= self.length, f"rows [{start}, {end}) of {self.length}"
        k, v = self.k[:, start:end], self.v[:, start:end]
        contiguous = torch.contiguous_format
        return ChunkKV(k.clone(memory_format=contiguous), v.clone(memory_format=contiguous), start)
