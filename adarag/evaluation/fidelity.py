"""Fidelity of reused KV: answers decoded from fused prefills against full recomputation.

For every question, the prompt ``system + chunks + question`` is prefilled in full (the
reference) and, for each selection rule and ratio, fused from every chunk's independent KV (as
ingest stores it) with that share of each chunk recomputed. Each variant decodes greedily; it is
scored against the reference answer of the *same prompt* (exact agreement of the normalised
answers, token-F1 agreement, first-token agreement, KL of the first token's distribution) and
against the gold answers (EM, F1, contains). TTFT is the wall time of the prefill (cached KV in
memory, first token included); the variants of one question run back to back so machine noise
hits them alike.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch

from adarag.cache.codec import KVCodec, StorageFormat
from adarag.config import FusionConfig, RecomputeConfig
from adarag.engine.batch import PrefillOutput
from adarag.engine.prefill_request import LearnedControls, OracleInputs, PrefillRequest
from adarag.errors import InputError
from adarag.evaluation.intervals import (
    Interval,
    PairedDifference,
    bootstrap_interval,
    paired_difference,
)
from adarag.evaluation.metrics import (
    best_exact_match,
    best_f1,
    exact_match,
    normalize_answer,
    token_f1,
)
from adarag.evaluation.output_oracle import output_oracle_scores
from adarag.evaluation.reuse import independent_chunks, reuse_sources
from adarag.evaluation.workload import BenchQuestion
from adarag.kv import ChunkKV
from adarag.pipeline import AdaRAG
from adarag.pipeline.answer_stream import answer_text
from adarag.pipeline.learned import learned_controls
from adarag.pipeline.offline import ChunkFuser
from adarag.profiles import ModelProfile
from adarag.retrievers.base import Retriever
from adarag.schema import Chunk, GenerationParams, PromptLayout

logger = logging.getLogger(__name__)

CONTROLS = ("random", "oracle", "output_oracle")
"""Rules that are controls, not product choices."""


@dataclass(frozen=True)
class FidelityRow:
    """One question under one rule and ratio."""

    dataset: str
    qid: str
    qtype: str | None
    rule: str
    ratio: float
    answer: str
    reference: str
    exact_agreement: float
    f1_agreement: float
    first_token_agreement: float
    first_token_kl: float
    gold_em: float
    gold_f1: float
    gold_contains: float
    reference_gold_f1: float
    ttft_s: float
    full_ttft_s: float
    num_prompt_tokens: int
    num_recomputed_tokens: int
    final_ratio: float | None = None
    """The ratio a routing ladder ended at (None without a ladder)."""


@dataclass(frozen=True)
class FidelitySummary:
    """Means of one rule at one ratio over a set of questions (agreement and gold in %).

    The intervals are 95% bootstrap intervals over the questions; ``gold_f1_vs_full`` is the
    paired difference of gold F1 against full recomputation on the same questions.
    """

    rule: str
    ratio: float
    num_questions: int
    exact_agreement: float
    f1_agreement: float
    first_token_agreement: float
    first_token_kl: float
    gold_em: float
    gold_f1: float
    gold_contains: float
    reference_gold_f1: float
    ttft_s: float
    full_ttft_s: float
    exact_interval: Interval | None = None
    first_token_interval: Interval | None = None
    gold_f1_interval: Interval | None = None
    gold_f1_vs_full: PairedDifference | None = None
    recomputed_share: float = 0.0

    @property
    def gold_f1_share(self) -> float | None:
        """Gold F1 as a share of full recomputation's (None when full scores 0)."""
        return self.gold_f1 / self.reference_gold_f1 if self.reference_gold_f1 else None


def first_token_kl(reference: torch.Tensor, other: torch.Tensor) -> float:
    """KL(reference || other) of two next-token logit vectors, in nats."""
    log_p = torch.log_softmax(reference.float(), dim=-1)
    log_q = torch.log_softmax(other.float(), dim=-1)
    return float((log_p.exp() * (log_p - log_q)).sum())


def contains_gold(answer: str, golds: Sequence[str]) -> float:
    """1.0 when a normalised gold answer appears in the normalised answer."""
    normalised = normalize_answer(answer)
    return float(
        any(normalize_answer(gold) and normalize_answer(gold) in normalised for gold in golds)
    )


class FidelityRun:
    """Runs rules and ratios over questions with one pipeline's model and prompt.

    Args:
        rag: The pipeline (its engine, prompt layout and checks).
        rules: Rule name -> selection (the same ratios go to every rule).
        ratios: Recomputation ratios of every chunk (1.0 is full recomputation of the chunks).
        params: Decoding options (greedy).
        storages: Storage formats the reused KV passes through (``cache.store.storage_dtype``
            values); a rule's rows under a format other than float32 are named
            ``<rule>@<format>``.
        knowledge_base: With one, every chunk reuses FusionRAG's fused entry instead of its
            independent KV: computed after its ``fusion.num_neighbors`` most similar chunks in
            the knowledge base (found with the chunk's text, as warming finds them), and only
            where ``fusion.min_neighbors_in_prompt`` of them are in the prompt (as a lookup
            gates it); the rows are named ``<rule>+fused<num_neighbors>[in<min_neighbors>]``.
        fusion: The fused entries' settings (``experimental.fusion``'s; ``enabled`` is not read).
        profile: Where a ``learned`` rule's scorer and a ``target_agreement`` rule's routing
            ladder come from (the pipeline's own profile when None).
    """

    def __init__(
        self,
        rag: AdaRAG,
        rules: Mapping[str, RecomputeConfig],
        ratios: Sequence[float],
        params: GenerationParams,
        storages: Sequence[StorageFormat] = ("float32",),
        knowledge_base: Retriever | None = None,
        fusion: FusionConfig | None = None,
        profile: ModelProfile | None = None,
    ) -> None:
        self.rag = rag
        self.rules = dict(rules)
        self.ratios = sorted(set(ratios))
        self.params = params
        self.codecs = {storage: KVCodec(storage) for storage in storages}
        self.knowledge_base = knowledge_base
        self.fusion = fusion or FusionConfig()
        self.profile = profile or rag.profile
        self._learned: dict[RecomputeConfig, LearnedControls] = {}

    def rule_name(self, rule: str, storage: StorageFormat) -> str:
        """The name of a rule's rows: ``<rule>[+fused<n>[in<gate>]][@<format>]``."""
        if self.knowledge_base is not None:
            gate = self.fusion.min_neighbors_in_prompt
            rule = f"{rule}+fused{self.fusion.num_neighbors}" + (f"in{gate}" if gate else "")
        return rule if storage == "float32" else f"{rule}@{storage}"

    def question(
        self,
        dataset: str,
        item: BenchQuestion,
        done: Collection[tuple[str, float]] = (),
    ) -> list[FidelityRow]:
        """Every rule and ratio on one question, but those (rule name, ratio) in ``done``."""
        engine = self.rag.engine
        layout = self.rag.layout(item.question, item.chunks, self.params)
        full_s, full, _ = self._timed(layout, None, None, None)
        reference, reference_ids = self._decode(layout, full)
        computed_system, computed_chunks = independent_chunks(engine, layout)
        if self.knowledge_base is not None:
            computed_chunks = self.fused_chunks(layout, item, computed_system, computed_chunks)
        rows = []
        for storage, codec in self.codecs.items():
            system_kv = _round_trip(codec, computed_system)
            chunk_kvs = [_round_trip(codec, kv) for kv in computed_chunks]
            reused: PrefillOutput | None = None
            # a packet with a trailer: the prompt and the chunks' entries closed by it
            trailed: dict[int, tuple[PromptLayout, list[ChunkKV]]] = {}
            for ratio in self.ratios:
                # at 0 and 1 no rule chooses: rules carrying the same packet share one prefill
                shared: dict[int, tuple[float, PrefillOutput, str]] = {}
                for rule, selection in self.rules.items():
                    name = self.rule_name(rule, storage)
                    if (name, ratio) in done:
                        continue
                    controls = self._controls(selection)
                    packet = id(controls.packet)
                    rule_layout, rule_chunks = layout, chunk_kvs
                    if controls.trailer_tokens:
                        if packet not in trailed:
                            trailed[packet] = self._trailed(
                                layout, controls, codec, computed_system
                            )
                        rule_layout, rule_chunks = trailed[packet]
                    if packet not in shared or 0.0 < ratio < 1.0:
                        sources = reuse_sources(system_kv, rule_chunks, ratio)
                        scores = None
                        if selection.selection_policy == "output_oracle" and 0.0 < ratio < 1.0:
                            if controls.trailer_tokens:
                                raise InputError(
                                    f"rule {rule!r}: the output oracle compares the prompt "
                                    "without a trailer; give it packet=off"
                                )
                            if reused is None:
                                reused = engine.prefill(
                                    PrefillRequest(layout, reuse_sources(system_kv, chunk_kvs, 0.0))
                                )
                            answer_ids = reference_ids or [int(full.logits.argmax())]
                            scores = output_oracle_scores(
                                engine, layout, reused.kv, full.kv, answer_ids, ratio
                            )
                        seconds, output, prefilled = self._timed(
                            rule_layout, sources, selection, full, scores
                        )
                        shared[packet] = (seconds, output, self._decode(prefilled, output)[0])
                    seconds, output, answer = shared[packet]
                    rows.append(
                        self._row(
                            dataset,
                            item,
                            name,
                            ratio,
                            layout,
                            (full, reference, full_s),
                            (output, answer, seconds),
                        )
                    )
        logger.info("%s %s: reference %r", dataset, item.qid, reference[:40])
        return rows

    def _trailed(
        self, layout: PromptLayout, controls: LearnedControls, codec: KVCodec, system_kv: ChunkKV
    ) -> tuple[PromptLayout, list[ChunkKV]]:
        """``layout`` with ``controls``' trailer closing every chunk, and those chunks' entries.

        Each entry is computed alone after the system prefix, its trailer embedded with the
        packet, and passes through ``codec`` as the store's would.
        """
        engine = self.rag.engine
        trailed = layout.with_trailers(controls.trailer_ids(engine.spec.vocab_size))
        entries = [
            engine.compute_chunk(trailed.system_ids, ids, system_kv, packet=controls.packet)
            for ids in trailed.chunk_ids
        ]
        return trailed, [_round_trip(codec, kv) for kv in entries]

    def fused_chunks(
        self,
        layout: PromptLayout,
        item: BenchQuestion,
        system_kv: ChunkKV,
        independent: list[ChunkKV],
    ) -> list[ChunkKV]:
        """Each chunk's fused entry, after its most similar chunks in the knowledge base.

        A chunk with fewer than ``fusion.min_neighbors_in_prompt`` of its neighbours in the
        prompt keeps its independent KV.
        """
        assert self.knowledge_base is not None
        engine = self.rag.engine
        alone = dict(zip(layout.chunk_ids, independent, strict=True))

        def independent_kv(ids: tuple[int, ...]) -> ChunkKV:
            if ids not in alone:
                alone[ids] = engine.compute_chunk(layout.system_ids, ids, system_kv)
            return alone[ids]

        fuser = ChunkFuser(self.fusion, engine, self.rag.prompts, system_kv, independent_kv)
        entries = []
        for ids, text, kv in zip(layout.chunk_ids, item.chunks, independent, strict=True):
            neighbours = fuser.neighbours(Chunk(text), self.knowledge_base)
            in_prompt = sum(other in layout.chunk_ids for other in neighbours)
            fused = in_prompt >= self.fusion.min_neighbors_in_prompt
            entries.append(fuser.fused_kv(ids, neighbours) if fused else kv)
        return entries

    def _timed(
        self,
        layout: PromptLayout,
        sources: list | None,
        selection: RecomputeConfig | None,
        full: PrefillOutput | None,
        position_scores: torch.Tensor | None = None,
    ) -> tuple[float, PrefillOutput, PromptLayout]:
        """The prefill's seconds (first token included), its output and the layout it ran."""
        learned = self._controls(selection)
        engine = self.rag.engine
        if sources is not None:
            layout = learned.bridged(layout, sources, engine.spec.vocab_size)
        started = time.perf_counter()
        output = engine.prefill(
            PrefillRequest(
                layout,
                sources,
                max_new_tokens=self.params.max_new_tokens,
                selection=selection,
                oracle=OracleInputs(
                    reference_kv=None if full is None else full.kv, position_scores=position_scores
                ),
                controls=learned,
            ),
        )
        output.logits.argmax()  # the first token
        return time.perf_counter() - started, output, layout

    def _controls(self, selection: RecomputeConfig | None) -> LearnedControls:
        """The profile's controls a rule asks for, resolved once (a missing part logged once)."""
        if selection is None:
            return LearnedControls()
        if selection not in self._learned:
            self._learned[selection] = learned_controls(selection, self.profile)
        return self._learned[selection]

    def _decode(self, layout: PromptLayout, output: PrefillOutput) -> tuple[str, list[int]]:
        """The answer's text and token ids."""
        engine = self.rag.engine
        tokens = list(engine.decode_tokens(layout, output, self.params))
        text = answer_text(tokens, engine.tokenizer, self.params)
        return text, tokens

    def _row(
        self,
        dataset: str,
        item: BenchQuestion,
        rule: str,
        ratio: float,
        layout: PromptLayout,
        full: tuple[PrefillOutput, str, float],
        fused: tuple[PrefillOutput, str, float],
    ) -> FidelityRow:
        full_output, reference, full_s = full
        output, answer, seconds = fused
        same_first = int(output.logits.argmax()) == int(full_output.logits.argmax())
        return FidelityRow(
            dataset=dataset,
            qid=item.qid,
            qtype=item.qtype,
            rule=rule,
            ratio=ratio,
            answer=answer,
            reference=reference,
            exact_agreement=exact_match(answer, reference),
            f1_agreement=token_f1(answer, reference),
            first_token_agreement=float(same_first),
            first_token_kl=first_token_kl(full_output.logits, output.logits),
            gold_em=best_exact_match(answer, item.answers),
            gold_f1=best_f1(answer, item.answers),
            gold_contains=contains_gold(answer, item.answers),
            reference_gold_f1=best_f1(reference, item.answers),
            ttft_s=seconds,
            full_ttft_s=full_s,
            num_prompt_tokens=layout.num_tokens,
            num_recomputed_tokens=output.num_recomputed_tokens,
            final_ratio=output.routing[-1].ratio if output.routing else None,
        )


def summarize(rows: Sequence[FidelityRow], intervals: bool = True) -> list[FidelitySummary]:
    """Per (rule, ratio) means in first-seen order, with 95% intervals when asked."""
    groups: dict[tuple[str, float], list[FidelityRow]] = {}
    for row in rows:
        groups.setdefault((row.rule, row.ratio), []).append(row)

    def pct(values: Sequence[float]) -> float:
        return 100 * statistics.fmean(values)

    def pct_interval(values: Sequence[float]) -> Interval | None:
        if not intervals:
            return None
        found = bootstrap_interval([100 * value for value in values])
        return Interval(found.mean, found.low, found.high)

    def vs_full(group: Sequence[FidelityRow]) -> PairedDifference | None:
        if not intervals:
            return None
        return paired_difference(
            [100 * r.gold_f1 for r in group], [100 * r.reference_gold_f1 for r in group]
        )

    return [
        FidelitySummary(
            rule=rule,
            ratio=ratio,
            num_questions=len(group),
            exact_agreement=pct([r.exact_agreement for r in group]),
            f1_agreement=pct([r.f1_agreement for r in group]),
            first_token_agreement=pct([r.first_token_agreement for r in group]),
            first_token_kl=statistics.fmean(r.first_token_kl for r in group),
            gold_em=pct([r.gold_em for r in group]),
            gold_f1=pct([r.gold_f1 for r in group]),
            gold_contains=pct([r.gold_contains for r in group]),
            reference_gold_f1=pct([r.reference_gold_f1 for r in group]),
            ttft_s=statistics.fmean(r.ttft_s for r in group),
            full_ttft_s=statistics.fmean(r.full_ttft_s for r in group),
            exact_interval=pct_interval([r.exact_agreement for r in group]),
            first_token_interval=pct_interval([r.first_token_agreement for r in group]),
            gold_f1_interval=pct_interval([r.gold_f1 for r in group]),
            gold_f1_vs_full=vs_full(group),
            recomputed_share=statistics.fmean(
                r.num_recomputed_tokens / r.num_prompt_tokens for r in group
            ),
        )
        for (rule, ratio), group in groups.items()
    ]


def paired_rules(
    rows: Sequence[FidelityRow], rule: str, baseline: str, ratio: float, metric: str
) -> PairedDifference | None:
    """``rule - baseline`` in ``metric`` (x100) at ``ratio``, over the questions both have."""
    first = {(r.dataset, r.qid): r for r in rows if r.rule == rule and r.ratio == ratio}
    second = {(r.dataset, r.qid): r for r in rows if r.rule == baseline and r.ratio == ratio}
    common = [key for key in first if key in second]
    if not common:
        return None
    return paired_difference(
        [100 * getattr(first[key], metric) for key in common],
        [100 * getattr(second[key], metric) for key in common],
    )


def read_rows(path: Path) -> list[FidelityRow]:
    """Rows written by :func:`append_rows` (none when the file does not exist yet)."""
    if not path.exists():
        return []
    names = {field.name for field in fields(FidelityRow)}
    optional = {"final_ratio"}  # rows written before the field existed lack it
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:  # a run killed mid-write leaves a partial line
            logger.warning(
                "%s:%d is not a whole row (%s); it is measured again", path, number, error
            )
            continue
        rows.append(
            FidelityRow(
                **{key: record[key] for key in names if key in record or key not in optional}
            )
        )
    return rows


def append_rows(path: Path, rows: Sequence[FidelityRow]) -> None:
    """Append rows as JSON lines (one question's rows at a time, so a stopped run resumes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        for row in rows:
            handle.write(json.dumps(asdict(row)) + "\n")


@dataclass(frozen=True)
class Target:
    """A quality target: the least a policy must keep of full recomputation's answers."""

    min_exact_agreement: float = 85.0
    min_gold_f1_share: float = 0.97
    min_first_token_agreement: float | None = None

    def is_met(self, summary: FidelitySummary) -> bool:
        """Whether ``summary`` meets every part of the target."""
        if self.min_first_token_agreement is not None:
            return summary.first_token_agreement >= self.min_first_token_agreement
        share = summary.gold_f1_share
        gold_ok = share is None or share >= self.min_gold_f1_share
        return summary.exact_agreement >= self.min_exact_agreement and gold_ok


def smallest_ratio_meeting(
    summaries: Sequence[FidelitySummary], rule: str, target: Target
) -> FidelitySummary | None:
    """The summary of ``rule`` at the smallest ratio that meets ``target`` (None if none does)."""
    meeting = [s for s in summaries if s.rule == rule and target.is_met(s)]
    return min(meeting, key=lambda s: s.ratio) if meeting else None


@dataclass(frozen=True)
class MatchedSpeedup:
    """The speed-up at which a rule keeps a level of quality (see :func:`matched_speedup`)."""

    speedup: float
    at_fastest: bool
    """The rule's fastest ratio already keeps the level: the speed-up is a lower bound."""


def matched_speedup(
    summaries: Sequence[FidelitySummary], rule: str, level: float, metric: str
) -> MatchedSpeedup | None:
    """The largest speed-up at which ``rule`` keeps ``metric`` (a summary field) at ``level``.

    Each of the rule's ratios is a point (mean speed-up over full, mean ``metric``); between the
    fastest point that keeps the level and the next faster one, the cost (TTFT as a share of
    full's, which grows about linearly with the recomputed share) is interpolated linearly. None
    when no ratio of the rule keeps the level. Comparing rules this way at one rule's own
    quality (matched quality) counts a better selection as speed, not as agreement.
    """
    points = sorted(
        ((s.full_ttft_s / s.ttft_s, getattr(s, metric)) for s in summaries if s.rule == rule),
        reverse=True,
    )
    for index, (speedup, value) in enumerate(points):
        if value < level:
            continue
        if index == 0:
            return MatchedSpeedup(speedup, at_fastest=True)
        faster, faster_value = points[index - 1]
        share = (level - faster_value) / (value - faster_value)
        cost = 1 / faster + share * (1 / speedup - 1 / faster)
        return MatchedSpeedup(1 / cost, at_fastest=False)
    return None


def _round_trip(codec: KVCodec, kv: ChunkKV) -> ChunkKV:
    """``kv`` as a store in ``codec``'s format serves it (in ``kv``'s dtype)."""
    return codec.decode(codec.encode(kv)).to(kv.k.dtype)
