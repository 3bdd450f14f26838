"""The prefills behind one answer: tier lookup, fused prefill, confidence, write-back.

Adaptive context augmentation (AdaCache Algorithm 1) is the loop in :meth:`AugmentedPrefill.run`:
each step looks the prompt's chunks up in the three tiers, runs the fused prefill, scores the
logit-lens confidence and, unless the controller stops, writes the chunks back so the next step
finds them in the hard tier.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from adarag.augment import AugmentationController, LensSignals, ScoredStep, StepResult
from adarag.augment.confidence import mean
from adarag.augment.prior import chunks_before_gap
from adarag.cache.tiers import TieredCache, TierHit
from adarag.config import AdaRagConfig
from adarag.engine.batch import PrefillOutput, SegmentSource
from adarag.engine.core import Engine
from adarag.engine.prefill_request import Collect, LearnedControls, PrefillRequest, ResidentKV
from adarag.engine.routing import ROUTING_FEATURES
from adarag.kv import ChunkKV
from adarag.pipeline.answer_stream import PreparedAnswer, decode_text
from adarag.pipeline.write_back import WriteBack, write_back
from adarag.schema import (
    Chunk,
    GenerationParams,
    PromptLayout,
    QueryTrace,
    StepTrace,
    StopReason,
    Tier,
)


@dataclass(frozen=True)
class PrefillStep:
    """One prefill of adaptive augmentation and what its write-back needs."""

    layout: PromptLayout
    output: PrefillOutput
    hits: list[TierHit]
    result: StepResult

    def with_prefix(
        self, prefix: tuple[int, ...], is_stable: bool | None, decode_s: float
    ) -> PrefillStep:
        """The step with its first answer tokens decoded (their cost counted with the lens')."""
        result = dataclasses.replace(
            self.result,
            answer_prefix=prefix,
            is_stable=is_stable,
            confidence_s=self.result.confidence_s + decode_s,
        )
        return dataclasses.replace(self, result=result)

    @property
    def tiers(self) -> tuple[Tier, ...]:
        """Where each chunk's KV came from (labels and earlier turns left out)."""
        return tuple(self.hits[idx].tier for idx in self.layout.chunk_segment_idx)


@dataclass(frozen=True)
class LookedUpPrefill:
    """A fused prefill with what the tiers found and the layout it prefilled."""

    layout: PromptLayout
    output: PrefillOutput
    hits: list[TierHit]
    prefill_s: float


class AugmentedPrefill:
    """Runs the augmentation steps of one request over an engine and the tiered cache.

    Args:
        engine: The backend.
        cache: The three-tier chunk-KV cache.
        config: Which tiers are on, the selection rule and its levers (sent with every
            prefill), whether to augment and the stop rules' levers (the logit-lens layers).
        controller: The confidence estimator and stop rule.
        engine_lock: Serialises engine work with other requests.
        system_kv: The system prefix's exact KV, reused by every prefill that reuses any chunk
            KV; None when every tier is off (each prefill computes its whole prompt).
        learned: The profile's token scorer and routing ladder, sent with every prefill.
        probe_layers: Layers whose residual stream (last prompt token) each step hands the stop
            rule (the depth probe's), with the chunks' retrieval scores; empty: none.
    """

    def __init__(
        self,
        engine: Engine,
        cache: TieredCache,
        config: AdaRagConfig,
        controller: AugmentationController,
        engine_lock: threading.RLock,
        system_kv: ChunkKV | None,
        learned: LearnedControls | None = None,
        probe_layers: Sequence[int] = (),
    ) -> None:
        self._engine = engine
        self._cache = cache
        self._tiers = config.cache
        self._strategies = config.experimental
        self._augment = config.augment
        self._levers = config.experimental.augment
        self._selection = config.selection
        self._controller = controller
        self._engine_lock = engine_lock
        self._system_kv = system_kv
        self._learned = learned or LearnedControls()
        self._probe_layers = tuple(probe_layers)

    @property
    def controller(self) -> AugmentationController:
        """The confidence estimator and stop rule each step is scored by."""
        return self._controller

    def run(
        self,
        layout: PromptLayout,
        chunks: Sequence[Chunk],
        params: GenerationParams,
        started: float,
        retrieval_s: float,
    ) -> PreparedAnswer:
        """Adaptive augmentation (or one static step) up to the KV the answer decodes from.

        Args:
            layout: The whole prompt, all of ``chunks`` in it.
            chunks: The retrieved chunks, best first.
            params: Decoding options (the KV reserves room for ``max_new_tokens``).
            started: ``time.perf_counter()`` when the request came (for TTFT).
            retrieval_s: Seconds retrieval took.
        """
        num_chunks = len(chunks)
        augment = self._augment.enabled
        score_gap = self._levers.score_gap
        if augment and score_gap is not None:
            floor = self._levers.min_chunks or 1
            num_chunks = chunks_before_gap([c.score for c in chunks], score_gap, floor)
        taken: list[tuple[ScoredStep, PrefillStep]] = []
        reason: StopReason | None = None
        previous: tuple[int, ...] | None = None
        last: PrefillStep | None = None
        scores = tuple(chunk.score for chunk in chunks)
        for step_chunks in range(1, num_chunks + 1) if augment else [num_chunks]:
            step = self._run_step(
                layout.with_chunks(step_chunks),
                params.max_new_tokens,
                last,
                layout.num_tokens,
                scores,
                self._probe_layers,
            )
            last = step
            scored = self._controller.score(step_chunks, step.result)
            if augment and self._controller.stop_rule.wants_answer_prefix(scored):
                step = self._decode_prefix(step, previous)
                scored = dataclasses.replace(scored, result=step.result)
            previous = step.result.answer_prefix
            taken.append((scored, step))
            reason = self._controller.should_stop(scored, num_chunks) if augment else "static"
            if reason is not None:
                break
            # Algorithm 1, line 18: the next step reuses c_i as is
            write_back(self._pending(step.layout, step.output, step.hits))
        assert reason is not None, "the stop rule must stop at the last step"
        return self._prepared(taken, reason, chunks, started, retrieval_s)

    def _prepared(
        self,
        taken: Sequence[tuple[ScoredStep, PrefillStep]],
        reason: StopReason,
        chunks: Sequence[Chunk],
        started: float,
        retrieval_s: float,
    ) -> PreparedAnswer:
        """The answer ready to decode from the last step taken, with the request's trace."""
        final = taken[-1][1]
        trace = QueryTrace(
            steps=tuple(
                _step_trace(scored, step, self._engine.tokenizer) for scored, step in taken
            ),
            stop_reason=reason,
            ttft_s=time.perf_counter() - started,
            num_prompt_tokens=final.layout.num_tokens,
            retrieval_s=retrieval_s,
        )
        return PreparedAnswer(
            final.layout,
            final.output,
            tuple(chunks[: len(final.layout.chunk_ids)]),
            trace,
            final.layout.num_tokens - final.output.num_recomputed_tokens,
            write_back=self._pending(final.layout, final.output, final.hits),
        )

    def each_step(
        self,
        layout: PromptLayout,
        params: GenerationParams,
        chunk_scores: Sequence[float | None] = (),
        probe_layers: Sequence[int] | None = None,
    ) -> list[tuple[StepTrace, str, StepResult]]:
        """Every step of ``layout``'s chunks (no early stop): trace, answer and what it reported.

        Step ``k`` is exactly what :meth:`run` would decode from if it stopped there (same
        tiers, same reuse of steps ``1..k-1``); for calibration and analysis.

        Args:
            layout: The whole prompt.
            params: Decoding options of each step's answer.
            chunk_scores: The chunks' retrieval scores (reported to the depth probe).
            probe_layers: Layers whose residual stream each step reports (the depth probe's
                records); the stop rule's when None.
        """
        layers = self._probe_layers if probe_layers is None else tuple(probe_layers)
        results = []
        previous: tuple[int, ...] | None = None
        last: PrefillStep | None = None
        num_prefix = self._levers.stability_tokens
        for num_chunks in range(1, len(layout.chunk_ids) + 1):
            step = self._run_step(
                layout.with_chunks(num_chunks),
                params.max_new_tokens,
                last,
                layout.num_tokens,
                tuple(chunk_scores),
                layers,
            )
            last = step
            with self._engine_lock:
                tokens = list(self._engine.decode_tokens(step.layout, step.output, params))
                deltas = decode_text(iter(tokens), self._engine.tokenizer, params)
                answer = "".join(deltas).strip()
            write_back(self._pending(step.layout, step.output, step.hits))
            # a greedy answer long enough already holds the prefix; else decode it on its own
            greedy = params.temperature == 0.0 and params.max_new_tokens >= num_prefix
            prefix = (
                tuple(tokens[:num_prefix])
                if greedy
                else self._answer_prefix(step.layout, step.output)
            )
            stable = None if previous is None else prefix == previous
            result = dataclasses.replace(step.result, answer_prefix=prefix, is_stable=stable)
            previous = prefix
            scored = self._controller.score(num_chunks, result)
            trace = _step_trace(scored, step, self._engine.tokenizer)
            results.append((trace, answer, result))
        return results

    def prefill_steps(self, layout: PromptLayout, max_new_tokens: int) -> Iterator[PrefillStep]:
        """Prefill every step of ``layout``'s chunks, each kept for the next; no decoding.

        Each step is yielded after its write-back (Algorithm 1, line 18), so the time between
        two yields is one step's whole cost.
        """
        last: PrefillStep | None = None
        for num_chunks in range(1, len(layout.chunk_ids) + 1):
            step = self._run_step(
                layout.with_chunks(num_chunks), max_new_tokens, last, layout.num_tokens
            )
            write_back(self._pending(step.layout, step.output, step.hits))
            yield step
            last = step

    def fused_prefill(
        self,
        layout: PromptLayout,
        max_new_tokens: int,
        previous: PrefillStep | None = None,
        min_capacity: int = 0,
    ) -> tuple[PrefillOutput, list[TierHit], float]:
        """Look the cached segments up in the tiers and run the fused prefill; returns its time.

        The cached segments are the chunks (after their labels, with citations) and the earlier
        turns of a conversation: one hit each. With every tier disabled this is a full
        recomputation, the system prefix included. A prompt that reuses chunk KV computed
        elsewhere carries the profile's bridge (:meth:`looked_up_prefill` returns that layout).

        Args:
            layout: The prompt.
            max_new_tokens: Rows reserved for the answer.
            previous: The request's previous augmentation step: with
                ``experimental.augment.reuse_step_kv`` its KV cache is prefilled into, the exact
                rows it shares with ``layout`` (the system prefix and the chunks found in the hard
                tier) left in place.
            min_capacity: Rows to allocate at least (the whole request's prompt).
        """
        prefilled = self.looked_up_prefill(layout, max_new_tokens, previous, min_capacity)
        return prefilled.output, prefilled.hits, prefilled.prefill_s

    def looked_up_prefill(
        self,
        layout: PromptLayout,
        max_new_tokens: int,
        previous: PrefillStep | None = None,
        min_capacity: int = 0,
    ) -> LookedUpPrefill:
        """:meth:`fused_prefill`, with the layout prefilled (the packet's, when it has one)."""
        strategies = self._strategies
        system = SegmentSource(self._system_kv, exact=self._system_kv is not None)
        vocab_size = self._engine.spec.vocab_size
        # a trailer ends every chunk (its entries hold it), whatever the tiers find
        trailed = layout.with_trailers(self._learned.trailer_ids(vocab_size))
        min_capacity += trailed.num_tokens - layout.num_tokens
        layout = trailed
        # the disk and the shared tier are read before the engine lock is taken
        hits = self._cache.lookup(layout.cached_segments)
        sources = [system, *(_source(hit) for hit in hits)]
        sources.append(SegmentSource())
        bridged = self._learned.bridged(layout, sources, vocab_size)
        # the whole request's rows, and the bridge's
        min_capacity += bridged.num_tokens - layout.num_tokens
        layout = bridged
        # Cache-Craft keeps the attention statistics of every chunk computed in full
        collect = strategies.variants.enabled and any(hit.tier == "miss" for hit in hits)
        reuse = self._levers.reuse_step_kv and previous is not None
        resident = None
        if reuse and previous is not None:
            resident = ResidentKV(previous.output.kv, _resident_rows(layout, hits, previous))
        request = PrefillRequest(
            layout,
            sources,
            max_new_tokens=max_new_tokens,
            min_capacity=min_capacity if self._levers.reuse_step_kv else 0,
            selection=self._selection,
            controls=self._learned,
            collect=Collect(self._levers.num_lens_layers, segment_attention=collect),
        )
        with self._engine_lock:
            started = time.perf_counter()
            output = self._engine.prefill(request, resident)
            prefill_s = time.perf_counter() - started
        self._cache.record(layout.num_tokens, output.num_recomputed_tokens)
        return LookedUpPrefill(layout, output, hits, prefill_s)

    def _run_step(
        self,
        layout: PromptLayout,
        max_new_tokens: int,
        previous: PrefillStep | None = None,
        min_capacity: int = 0,
        chunk_scores: tuple[float | None, ...] = (),
        probe_layers: tuple[int, ...] = (),
    ) -> PrefillStep:
        """One augmentation step: fused prefill of ``layout``, its lens signals and margin.

        With probe layers, the step also reports the last prompt token's residual stream there
        and the chunks' retrieval scores (the depth probe reads them; no extra forward pass).
        """
        prefilled = self.looked_up_prefill(layout, max_new_tokens, previous, min_capacity)
        layout, output, hits, prefill_s = (
            prefilled.layout,
            prefilled.output,
            prefilled.hits,
            prefilled.prefill_s,
        )
        lens_started = time.perf_counter()
        kl, entropy = self._engine.lens_signals(output, self._levers.num_lens_layers)
        top2 = torch.softmax(output.logits.float().reshape(-1), dim=-1).topk(2).values
        result = StepResult(
            LensSignals(tuple(kl), entropy),
            output.num_processed_tokens,
            output.num_recomputed_tokens,
            prefill_s,
            time.perf_counter() - lens_started,
            margin=float(top2[0] - top2[1]),
        )
        if probe_layers:
            hidden = output.layer_hidden[list(probe_layers)].float().reshape(-1)
            result = dataclasses.replace(
                result, hidden=tuple(hidden.tolist()), chunk_scores=chunk_scores
            )
        return PrefillStep(layout, output, hits, result)

    def _decode_prefix(self, step: PrefillStep, previous: tuple[int, ...] | None) -> PrefillStep:
        """``step`` with its first answer tokens and whether they repeat ``previous``."""
        started = time.perf_counter()
        prefix = self._answer_prefix(step.layout, step.output)
        stable = None if previous is None else prefix == previous
        return step.with_prefix(prefix, stable, time.perf_counter() - started)

    def _answer_prefix(self, layout: PromptLayout, output: PrefillOutput) -> tuple[int, ...]:
        """The first ``stability_tokens`` greedy answer tokens (the prompt's KV is unchanged)."""
        greedy = GenerationParams(max_new_tokens=self._levers.stability_tokens)
        with self._engine_lock:
            return tuple(self._engine.decode_tokens(layout, output, greedy))

    def write_back(self, layout: PromptLayout, output: PrefillOutput, hits: list[TierHit]) -> None:
        """Store each cached segment under its hard and soft keys (Algorithm 1, line 18)."""
        write_back(self._pending(layout, output, hits))

    def _pending(
        self, layout: PromptLayout, output: PrefillOutput, hits: Sequence[TierHit]
    ) -> WriteBack:
        """What storing a prefill's segments takes (run without the engine lock)."""
        with_variants = self._strategies.variants.enabled
        return WriteBack(self._cache, layout, output, hits, with_variants)


def _resident_rows(
    layout: PromptLayout, hits: Sequence[TierHit], previous: PrefillStep | None
) -> int:
    """Leading rows of ``previous``'s KV that hold ``layout``'s exact KV, at a segment end.

    The leading segments both prompts share before their query suffixes: the system prefix, then
    each cached segment that is the same in both and was found in the hard tier.
    """
    if previous is None:
        return 0
    rows = 0
    pairs = zip(layout.segments[:-1], previous.layout.segments[:-1], strict=False)
    for idx, (segment, earlier) in enumerate(pairs):  # idx 0: the system prefix
        if segment != earlier or (idx > 0 and hits[idx - 1].tier != "hard"):
            break
        rows += len(segment)
    return rows


def _source(hit: TierHit) -> SegmentSource:
    """A chunk's segment source; a variant's ranking becomes its tokens' scores (best highest)."""
    exact = hit.tier == "hard"
    if hit.token_ranking is None:
        return SegmentSource(hit.kv, hit.recompute_ratio, exact=exact)
    num_tokens = len(hit.token_ranking)
    scores = torch.empty(num_tokens)
    scores[torch.tensor(hit.token_ranking)] = torch.arange(num_tokens, 0, -1, dtype=torch.float32)
    return SegmentSource(hit.kv, hit.recompute_ratio, scores, exact=exact)


def _step_trace(scored: ScoredStep, step: PrefillStep, tokenizer: Any) -> StepTrace:
    result = scored.result
    prefix = result.answer_prefix
    routing = step.output.routing
    decided = [rung.probability for rung in routing if rung.probability is not None]
    return StepTrace(
        num_chunks=scored.num_chunks,
        confidence=scored.confidence.value,
        kl_score=scored.confidence.kl_score,
        entropy_score=scored.confidence.entropy_score,
        num_processed_tokens=result.num_processed_tokens,
        num_recomputed_tokens=result.num_recomputed_tokens,
        tiers=step.tiers,
        prefill_s=result.prefill_s,
        confidence_s=result.confidence_s + scored.scoring_s,
        mean_kl=mean(result.signals.kl),
        entropy=result.signals.entropy,
        margin=result.margin,
        answer_prefix=None if prefix is None else tokenizer.decode(list(prefix)),
        is_stable=result.is_stable,
        probability=scored.probability,
        rungs=tuple(rung.ratio for rung in routing),
        agreement_probability=decided[-1] if decided else None,
        reused_entropy=routing[0].features[ROUTING_FEATURES.index("entropy_reused")]
        if routing
        else None,
    )
