"""The layer-by-layer forward loop: full prefill, fused (blended) prefill and decode.

A fused prefill loads each cached segment's KV into one cache (re-rotating its keys to their
positions), chooses the tokens to recompute (``adarag.engine.blend``), and runs only those
tokens -- plus every uncached token and the whole query suffix -- through every layer, attending
to the fused KV with an absolute-position causal mask. A full prefill is the special case where
nothing is cached.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from adarag.config import EngineConfig, KernelConfig, RecomputeConfig
from adarag.engine.adapter import DecoderAdapter
from adarag.engine.batch import ForwardBatch, PrefillOutput
from adarag.engine.blend import (
    cross_chunk_ratio,
    select_top_per_segment,
    split_positions,
    value_deviation,
)
from adarag.engine.kv_cache import KVCache
from adarag.engine.rope import apply_rope, rope_cos_sin, rope_inv_freq
from adarag.kernels import kv_scatter, segment_attention_mass, selective_attention


@dataclass
class _Stream:
    """Residual stream of the tokens being computed, and what the loop records."""

    hidden: torch.Tensor  # [n, hidden_size]
    positions: torch.Tensor  # [n] ascending
    last_hidden: list[torch.Tensor]
    segment_attention: list[torch.Tensor]


class Runner:
    """Runs a :class:`DecoderAdapter` for prefill, fused prefill and decode (one sequence)."""

    def __init__(
        self,
        model: DecoderAdapter,
        engine_config: EngineConfig,
        kernel_config: KernelConfig,
        recompute_config: RecomputeConfig,
    ) -> None:
        self.model = model
        self.spec = model.spec
        self.engine_config = engine_config
        self.backend = kernel_config.backend
        self.recompute_config = recompute_config
        self.device = torch.device(engine_config.device)
        self.dtype = getattr(torch, engine_config.dtype)
        self.inv_freq = rope_inv_freq(self.spec).to(self.device)
        self.scale = self.spec.head_dim**-0.5

    def new_cache(self, capacity: int) -> KVCache:
        """An empty fused KV cache with ``capacity`` rows."""
        spec = self.spec
        return KVCache(
            spec.num_layers, capacity, spec.num_kv_heads, spec.head_dim, self.dtype, self.device
        )

    @torch.inference_mode()
    def prefill(self, batch: ForwardBatch) -> PrefillOutput:
        """Compute every token of the prompt through every layer (no cached KV)."""
        assert all(segment.cached is None for segment in batch.segments), "use blend()"
        return self.blend(batch)

    @torch.inference_mode()
    def blend(self, batch: ForwardBatch) -> PrefillOutput:
        """Fused prefill: load cached segments, select tokens, recompute them, fuse.

        Args:
            batch: The prompt and, per segment, its cached KV and recomputation ratio.

        Returns:
            The fused KV, last-token logits and per-layer last-token hidden states.
        """
        num_tokens = batch.num_tokens
        kv = self.new_cache(num_tokens + batch.extra_capacity)
        # --- load: cached segments, keys re-rotated to their positions
        for segment in batch.segments:
            if segment.cached is not None:
                kv.load(segment.start, segment.cached, self.inv_freq, self.backend)
        kv.length = num_tokens
        always, candidates = split_positions(batch.segments)
        assert always.numel() and int(always[-1]) == num_tokens - 1, "last token must be computed"
        processed = torch.cat((always, candidates)).sort().values.to(self.device)
        # --- select and recompute the layers that selection needs
        if candidates.numel() == 0:
            positions = always.to(self.device)
            stream = self._new_stream(batch.token_ids[always], positions)
            first_layer = 0
        elif self.recompute_config.selection_policy == "cross_attention":
            stream = self._select_by_cross_attention(batch, kv, processed)
            first_layer = 1
        else:
            stream = self._select_by_deviation(batch, kv, processed)
            first_layer = self.recompute_config.deviation_check_layer + 1
        recomputed = stream.positions.clone()
        # --- recompute the selected tokens through the remaining layers
        cos_sin = rope_cos_sin(stream.positions, self.inv_freq, self.dtype)
        cu = self._cu_segments(batch) if batch.collect_segment_attention else None
        for layer_idx in range(first_layer, self.spec.num_layers):
            self._layer_step(layer_idx, stream, kv, cos_sin, cu)
        # --- logits of the last token, and the logit lens of the layers below in the same GEMM
        layer_hidden = torch.stack(stream.last_hidden)
        head_logits = self.model.logits(layer_hidden[-batch.num_lens_layers :])
        return PrefillOutput(
            kv=kv,
            logits=head_logits[-1],
            layer_hidden=layer_hidden,
            recomputed_positions=recomputed.cpu(),
            num_processed_tokens=int(processed.numel()),
            segment_attention=self._aggregate(stream, batch) if cu is not None else None,
            lens_logits=head_logits if batch.num_lens_layers > 1 else None,
        )

    @torch.inference_mode()
    def decode(self, token_id: int, kv: KVCache) -> torch.Tensor:
        """Append one token at position ``kv.length`` and return its float32 logits [vocab]."""
        assert kv.length < kv.capacity, f"KV cache full at {kv.capacity} rows"
        token_ids = torch.tensor([token_id], dtype=torch.int64, device=self.device)
        positions = torch.tensor([kv.length], dtype=torch.int64, device=self.device)
        kv.length += 1
        stream = self._new_stream(token_ids, positions)
        cos_sin = rope_cos_sin(positions, self.inv_freq, self.dtype)
        for layer_idx in range(self.spec.num_layers):
            self._layer_step(layer_idx, stream, kv, cos_sin, None)
        return self.model.logits(stream.hidden)[0]

    def _new_stream(self, token_ids: torch.Tensor, positions: torch.Tensor) -> _Stream:
        """Embed ``token_ids [n]`` standing at ``positions [n]``."""
        hidden = self.model.embed(token_ids.to(self.device)).to(self.dtype)
        return _Stream(hidden, positions, [], [])

    def _layer_step(
        self,
        layer_idx: int,
        stream: _Stream,
        kv: KVCache,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        cu_segments: torch.Tensor | None,
    ) -> None:
        """Run one layer for the stream's tokens, writing their K/V into the fused cache."""
        layer = self.model.decoder_layers[layer_idx]
        q, k, v = layer.project_qkv(stream.hidden)
        q, k = apply_rope(q, *cos_sin), apply_rope(k, *cos_sin)
        kv_scatter(kv.k[layer_idx], kv.v[layer_idx], k, v, stream.positions, backend=self.backend)
        attn = self._attend(layer_idx, q, stream.positions, kv)
        if cu_segments is not None:
            mass = self._segment_mass(layer_idx, q, stream.positions, kv, cu_segments)
            stream.segment_attention.append(mass.mean(dim=1))
        stream.hidden = layer.finish(stream.hidden, attn)
        stream.last_hidden.append(stream.hidden[-1])

    def _attend(
        self, layer_idx: int, q: torch.Tensor, positions: torch.Tensor, kv: KVCache
    ) -> torch.Tensor:
        return selective_attention(
            q,
            kv.k[layer_idx, : kv.length],
            kv.v[layer_idx, : kv.length],
            positions,
            self.scale,
            query_block=self.engine_config.attention_query_block,
            backend=self.backend,
        )

    def _segment_mass(
        self,
        layer_idx: int,
        q: torch.Tensor,
        positions: torch.Tensor,
        kv: KVCache,
        cu_segments: torch.Tensor,
    ) -> torch.Tensor:
        return segment_attention_mass(
            q,
            kv.k[layer_idx, : kv.length],
            positions,
            self.scale,
            cu_segments,
            query_block=self.engine_config.attention_query_block,
            backend=self.backend,
        )

    def _select_by_cross_attention(
        self, batch: ForwardBatch, kv: KVCache, processed: torch.Tensor
    ) -> _Stream:
        """Layer 0 for all processed tokens; rank candidates by cross-chunk attention there."""
        stream = self._new_stream(batch.token_ids[processed.cpu()], processed)
        layer = self.model.decoder_layers[0]
        q, k, v = layer.project_qkv(stream.hidden)
        cos_sin = rope_cos_sin(processed, self.inv_freq, self.dtype)
        q, k = apply_rope(q, *cos_sin), apply_rope(k, *cos_sin)
        kv_scatter(kv.k[0], kv.v[0], k, v, processed, backend=self.backend)
        # --- select: cross-chunk attention share of every candidate at the first layer
        _, candidates = split_positions(batch.segments)
        is_candidate = torch.isin(processed.cpu(), candidates).to(processed.device)
        cu = self._cu_segments(batch)
        mass = self._segment_mass(0, q[is_candidate], processed[is_candidate], kv, cu)
        candidate_positions = processed[is_candidate].cpu()
        scores = cross_chunk_ratio(mass, candidate_positions, cu.tolist())
        keep = self._keep_mask(batch, processed, scores, candidate_positions)
        # --- recompute layer 0 for the kept tokens
        attn = self._attend(0, q[keep], processed[keep], kv)
        stream.hidden = layer.finish(stream.hidden[keep], attn)
        stream.positions = processed[keep]
        stream.last_hidden.append(stream.hidden[-1])
        if batch.collect_segment_attention:
            kept_mass = self._segment_mass(0, q[keep], processed[keep], kv, cu)
            stream.segment_attention.append(kept_mass.mean(dim=1))
        return stream

    def _select_by_deviation(
        self, batch: ForwardBatch, kv: KVCache, processed: torch.Tensor
    ) -> _Stream:
        """Layers below the check layer for all processed tokens; rank by V deviation at it."""
        check = self.recompute_config.deviation_check_layer
        assert check < self.spec.num_layers, f"check layer {check} of {self.spec.num_layers}"
        stream = self._new_stream(batch.token_ids[processed.cpu()], processed)
        cos_sin = rope_cos_sin(processed, self.inv_freq, self.dtype)
        cu = self._cu_segments(batch) if batch.collect_segment_attention else None
        for layer_idx in range(check):
            self._layer_step(layer_idx, stream, kv, cos_sin, cu)
        layer = self.model.decoder_layers[check]
        q, k, v = layer.project_qkv(stream.hidden)
        q, k = apply_rope(q, *cos_sin), apply_rope(k, *cos_sin)
        # --- select: V deviation from the cache at the check layer
        deviation = value_deviation(v, kv.v[check, processed]).cpu()
        kv_scatter(kv.k[check], kv.v[check], k, v, processed, backend=self.backend)
        _, candidates = split_positions(batch.segments)
        is_candidate = torch.isin(processed.cpu(), candidates)
        keep = self._keep_mask(batch, processed, deviation[is_candidate], candidates)
        # --- recompute the check layer for the kept tokens
        attn = self._attend(check, q[keep], processed[keep], kv)
        if cu is not None:
            mass = self._segment_mass(check, q[keep], processed[keep], kv, cu)
            stream.segment_attention.append(mass.mean(dim=1))
        stream.hidden = layer.finish(stream.hidden[keep], attn)
        stream.positions = processed[keep]
        stream.last_hidden.append(stream.hidden[-1])
        return stream

    def _keep_mask(
        self,
        batch: ForwardBatch,
        processed: torch.Tensor,
        scores: torch.Tensor,
        candidate_positions: torch.Tensor,
    ) -> torch.Tensor:
        """Mask over ``processed``: always-computed tokens plus the top-scored candidates."""
        processed_cpu = processed.cpu()
        always, _ = split_positions(batch.segments)
        chosen = select_top_per_segment(scores, candidate_positions, batch.segments)
        keep = torch.isin(processed_cpu, always) | torch.isin(processed_cpu, chosen)
        return keep.to(processed.device)

    def _cu_segments(self, batch: ForwardBatch) -> torch.Tensor:
        return torch.tensor(batch.cu_segments, dtype=torch.int64, device=self.device)

    def _aggregate(self, stream: _Stream, batch: ForwardBatch) -> torch.Tensor:
        """Per layer, mean attention mass from each query segment to each key segment."""
        bounds = torch.tensor(batch.cu_segments[1:])
        num_segments = len(batch.segments)
        layers = []
        for layer_mass in stream.segment_attention:  # [n_layer_tokens, num_segments]
            num_rows = layer_mass.shape[0]
            positions = stream.positions.cpu() if num_rows == stream.positions.numel() else None
            assert positions is not None, "segment attention needs the same tokens in every layer"
            owner = torch.bucketize(positions, bounds, right=True)
            table = torch.zeros(num_segments, num_segments)
            table.index_add_(0, owner, layer_mass.cpu())
            counts = torch.bincount(owner, minlength=num_segments).clamp(min=1)
            layers.append(table / counts[:, None])
        return torch.stack(layers)
