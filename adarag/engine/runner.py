"""The fused prefill and decode: the layer loop of one sequence.

A fused prefill loads each cached segment's KV into one cache (re-rotating its keys to their
positions), resolves one :class:`~adarag.engine.selection.RecomputePlan`, lets the request's
selection rule choose the tokens to recompute, and runs only those tokens -- plus every uncached
token and the whole query suffix -- through every layer, attending to the fused KV with an
absolute-position causal mask. A full prefill is the special case where nothing is cached.

The levers a request may turn on are objects the loop calls: the query pass
(:mod:`~adarag.engine.query_pass`), uncertainty routing and the routing ladder
(:mod:`~adarag.engine.climb`), gradual narrowing (:mod:`~adarag.engine.gradual`) and focused
chunks (:class:`~adarag.engine.focus.ChunkFocus`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from adarag.engine.batch import ForwardBatch, PrefillOutput
from adarag.engine.climb import climb, route_on_entropy
from adarag.engine.focus import ChunkFocus
from adarag.engine.gradual import GradualSchedule
from adarag.engine.kv_cache import KVCache
from adarag.engine.layer_stack import LayerStack
from adarag.engine.query_pass import QueryReading, query_pass
from adarag.engine.rope import apply_rope
from adarag.engine.selection import RecomputePlan, layer_budget_factor, segment_sums
from adarag.engine.selection_rules import (
    ScoringInputs,
    SelectionRule,
    candidate_features,
    selection_rule,
)
from adarag.engine.stream import Stream, rescale_reused, segment_attention_table, token_attention
from adarag.errors import InputError
from adarag.kernels import kv_scatter


class Runner(LayerStack):
    """Runs a :class:`~adarag.engine.adapter.DecoderAdapter` for prefill, fused prefill and decode.

    Everything that may differ per request (ratios, the selection rule and its knobs, lens
    layers) arrives with the :class:`ForwardBatch`.
    """

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
        kv, plan = self._load(batch)
        cu = self.cu_segments(batch) if batch.collect_segment_attention else None
        if plan.has_candidates:
            stream, first_layer, plan = self._select(batch, plan, kv)
        else:
            stream = self.new_stream(batch.token_ids[plan.always], plan.always, batch.packet)
            first_layer = 0
        recomputed = stream.positions.clone()
        self._recompute(batch, plan, kv, stream, first_layer, cu)
        layer_hidden = torch.stack(stream.last_hidden)
        routing = stream.uncertainty
        if batch.ladder is not None and stream.scores is not None:
            layer_hidden, recomputed, routing = climb(
                self, batch, plan, kv, stream, layer_hidden, recomputed
            )
        # --- logits of the last token, and the logit lens of the layers below in the same GEMM
        head_logits = self.model.logits(layer_hidden[-batch.num_lens_layers :])
        return PrefillOutput(
            kv=kv,
            logits=head_logits[-1],
            layer_hidden=layer_hidden,
            recomputed_positions=recomputed.cpu(),
            num_processed_tokens=int(plan.processed.numel()),
            segment_attention=segment_attention_table(stream, batch) if cu is not None else None,
            lens_logits=head_logits if batch.num_lens_layers > 1 else None,
            token_attention=token_attention(stream) if cu is not None else None,
            token_attention_positions=stream.positions.cpu() if cu is not None else None,
            candidate_features=stream.candidate_features,
            routing=routing,
        )

    def _load(self, batch: ForwardBatch) -> tuple[KVCache, RecomputePlan]:
        """The cache with every cached segment's KV in place (keys re-rotated), and the plan."""
        kv, resident_rows = self._prefill_cache(batch)
        for segment in batch.segments:
            if segment.cached is not None and segment.end > resident_rows:
                kv.load(segment.start, segment.cached, self.inv_freq, self.backend)
        kv.length = batch.num_tokens
        rescale_reused(kv, batch)
        plan = RecomputePlan.of(batch.segments)
        assert int(plan.always[-1]) == batch.num_tokens - 1, "last token must be computed"
        return kv, plan

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

    def _recompute(
        self,
        batch: ForwardBatch,
        plan: RecomputePlan,
        kv: KVCache,
        stream: Stream,
        first_layer: int,
        cu: torch.Tensor | None,
    ) -> None:
        """Run the stream from ``first_layer`` to the top, narrowing and focusing as asked."""
        cos_sin = self.cos_sin(stream.positions)
        selection = batch.selection
        gradual = None
        if selection.layer_schedule == "gradual" and plan.has_candidates:
            gradual = GradualSchedule(self, plan, selection)
        focus = None
        if selection.focus_window is not None and plan.has_candidates:
            focus = ChunkFocus(self, batch, plan)
        for layer_idx in range(first_layer, self.spec.num_layers):
            if gradual is not None:
                cos_sin = gradual.narrow(layer_idx, stream, kv, cos_sin)
            queries = focus.queries(layer_idx, stream, cos_sin) if focus is not None else None
            self.layer_step(layer_idx, stream, kv, cos_sin, cu)
            if focus is not None and queries is not None:
                cos_sin, final = focus.update(layer_idx, queries, kv, stream, cos_sin)
                if final:  # stable: stop recomputing the other cached chunks
                    focus = None

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
        cos, sin = self.cos_sin(positions)
        for layer_idx, layer in enumerate(self.model.decoder_layers):
            q, k, v = layer.project_qkv(hidden)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            rows = []
            for row, kv in enumerate(kvs):
                one = slice(row, row + 1)
                kv_scatter(kv.k[layer_idx], kv.v[layer_idx], k[one], v[one], positions[one])
                rows.append(self.attend(layer_idx, q[one], positions[one], kv))
            hidden = layer.finish(hidden, torch.cat(rows))
        return self.model.logits(hidden)

    # --- selection

    def _select(
        self, batch: ForwardBatch, plan: RecomputePlan, kv: KVCache
    ) -> tuple[Stream, int, RecomputePlan]:
        """Choose the candidates to recompute; returns their stream, its next layer and the plan.

        Rules scoring inside the loop run every processed token through the layers below the
        scoring layer, project it there, score, and finish that layer for the kept tokens only;
        the others score before any layer. Uncertainty routing may raise the plan's ratios.
        """
        selection = batch.selection
        rule = selection_rule(selection)
        processed = plan.processed.to(self.device)
        stream = self.new_stream(batch.token_ids[plan.processed], processed, batch.packet)
        reading = self._read_query(batch, plan, kv, rule)
        stream.reused_logits = reading.logits
        plan = route_on_entropy(plan, selection, stream)
        weights = None
        if selection.chunk_allocation == "query":
            assert reading.mass is not None
            weights = segment_sums(reading.mass, batch.cu_segments)
        layer_at = rule.scoring_layer(selection)
        if layer_at is None:
            stream.scores = rule.score(
                ScoringInputs(batch, plan, kv, reading.mass, reading.layer_mass)
            )
            keep = self._keep_mask(batch, plan, stream.scores, 0, weights)
            stream.hidden, stream.positions = stream.hidden[keep], processed[keep]
            return stream, 0, plan
        self._score_at_layer(batch, plan, kv, stream, rule, layer_at, reading, weights)
        return stream, layer_at + 1, plan

    def _read_query(
        self, batch: ForwardBatch, plan: RecomputePlan, kv: KVCache, rule: SelectionRule
    ) -> QueryReading:
        """The query pass, when a lever or the rule reads it."""
        selection = batch.selection
        mass = selection.chunk_allocation == "query" or rule.needs_query_attention
        per_layer = rule.needs_layer_attention or batch.collect_features
        logits = selection.uncertain_entropy is not None or batch.ladder is not None
        if not (mass or per_layer or logits):
            return QueryReading()
        return query_pass(self, batch, plan, kv, mass, logits, per_layer)

    def _keep_mask(
        self,
        batch: ForwardBatch,
        plan: RecomputePlan,
        scores: torch.Tensor,
        layer: int,
        weights: torch.Tensor | None,
    ) -> torch.Tensor:
        """Which processed tokens stay: the candidates ``scores`` choose, and every other."""
        selection = batch.selection
        factor = layer_budget_factor(layer, self.spec.num_layers, selection)
        chosen = plan.choose(scores, selection, budget_factor=factor, segment_weights=weights)
        return plan.keep_mask(chosen).to(self.device)

    def _score_at_layer(
        self,
        batch: ForwardBatch,
        plan: RecomputePlan,
        kv: KVCache,
        stream: Stream,
        rule: SelectionRule,
        layer_at: int,
        reading: QueryReading,
        weights: torch.Tensor | None,
    ) -> None:
        """Run the processed tokens up to ``layer_at``, score them there, finish it for the kept."""
        if layer_at >= self.spec.num_layers:
            raise InputError(
                f"selection layer {layer_at} does not exist in a {self.spec.num_layers}-layer "
                "model; set experimental.recompute.deviation_check_layer below the layer count"
            )
        processed = stream.positions
        cos_sin = self.cos_sin(processed)
        cu = self.cu_segments(batch)
        collect = cu if batch.collect_segment_attention else None
        for layer_idx in range(layer_at):
            self.layer_step(layer_idx, stream, kv, cos_sin, collect)
        q, k, v = self.project(layer_at, stream.hidden, cos_sin)
        is_candidate = plan.candidate_mask().to(self.device)
        # the cached rows, gathered (copied) before the fresh ones overwrite them
        reads_cached = rule.reads_cached_values or batch.collect_features
        inputs = ScoringInputs(
            batch,
            plan,
            kv,
            reading.mass,
            reading.layer_mass,
            fresh_k=k[is_candidate],
            fresh_v=v[is_candidate],
            cached_k=kv.k[layer_at, plan.candidates] if reads_cached else None,
            cached_v=kv.v[layer_at, plan.candidates] if reads_cached else None,
            candidate_mass=lambda: self.segment_mass(
                layer_at, q[is_candidate], processed[is_candidate], kv, cu
            ),
        )
        self.write(kv, layer_at, k, v, processed)
        if batch.collect_features:
            stream.candidate_features = candidate_features(inputs)
        stream.scores = rule.score(inputs)
        keep = self._keep_mask(batch, plan, stream.scores, layer_at, weights)
        # --- finish the scoring layer for the kept tokens
        attn = self.attend(layer_at, q[keep], processed[keep], kv)
        if collect is not None:
            mass = self.segment_mass(layer_at, q[keep], processed[keep], kv, collect)
            stream.segment_attention.append(mass.mean(dim=1))
            stream.segment_positions.append(processed[keep])
        stream.hidden = self.model.decoder_layers[layer_at].finish(stream.hidden[keep], attn)
        stream.positions = processed[keep]
        stream.last_hidden.append(stream.hidden[-1])
