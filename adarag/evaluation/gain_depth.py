"""Chunk selection by information gain, replayed over recorded questions.

A record (``benchmarks/depth.py gain``) holds, for one question's top-K retrieved chunks: each
chunk's gain, and the full-recomputation answer of every set a rule here can pick: no context,
each chunk alone, fixed top-k, the top-k by gain (k = 1..K), and the set each τ of
:data:`THRESHOLDS` keeps in retrieval order. A rule is then a choice of set per question; its
F1 and prompt tokens are read off the record, its TTFT priced from the timed full prefills (plus
the measured scoring pass where the rule scores gains).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from adarag.augment.gain import GainOrder, kept_chunks
from adarag.augment.prior import chunks_before_gap
from adarag.evaluation.depth import fixed_at_tokens, static_fit

THRESHOLDS = (-0.1, 0.0, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3)
"""The τ a record holds every kept set of (calibration picks among them)."""


def subset_key(indices: Sequence[int]) -> str:
    """A set of chunk indices as a record's key."""
    return ",".join(str(idx) for idx in indices)


@dataclass(frozen=True)
class Answered:
    """One prompt's answer: gold F1 (0..1) and prompt tokens."""

    f1: float
    tokens: int


@dataclass(frozen=True)
class GainQuestion:
    """One recorded question (see the module docstring)."""

    qid: str
    scores: tuple[float, ...]
    gains: tuple[float, ...]
    scoring_s: float
    none: Answered
    single: tuple[Answered, ...]
    fixed: tuple[Answered, ...]
    gain_order: tuple[int, ...]
    by_gain: tuple[Answered, ...]
    by_gain_confidence: tuple[float, ...]
    subsets: dict[str, Answered]
    static: tuple[tuple[int, float], ...]
    cost: dict[str, dict[str, float]]
    """Seconds of the scoring pass and of a full prefill over the top-N, by N (some questions)."""
    gold: tuple[bool, ...] = ()
    """Whether each chunk holds a gold passage (or the answer)."""

    @classmethod
    def from_record(cls, row: dict) -> GainQuestion:
        """A question as ``benchmarks/depth.py gain`` writes it."""

        def answered(item: dict) -> Answered:
            return Answered(float(item["f1"]), int(item["tokens"]))

        return cls(
            row["qid"],
            tuple(row["scores"]),
            tuple(row["gains"]),
            float(row["scoring_s"]),
            answered(row["none"]),
            tuple(answered(item) for item in row["single"]),
            tuple(answered(item) for item in row["fixed"]),
            tuple(row["gain_order"]),
            tuple(answered(item) for item in row["by_gain"]),
            tuple(float(item["confidence"]) for item in row["by_gain"]),
            {key: answered(item) for key, item in row["subsets"].items()},
            tuple((item["tokens"], item["seconds"]) for item in row["static"]),
            row.get("cost", {}),
            tuple(bool(flag) for flag in row.get("gold", ())),
        )

    @property
    def max_k(self) -> int:
        """Chunks scored (the deepest fixed prompt's)."""
        return len(self.fixed)

    def answer(self, indices: Sequence[int]) -> Answered:
        """The recorded answer of the prompt holding ``indices`` in that order.

        Raises:
            KeyError: The record holds no answer for that set.
        """
        indices = list(indices)
        if not indices:
            return self.none
        if indices == list(range(len(indices))):
            return self.fixed[len(indices) - 1]
        if indices == list(self.gain_order[: len(indices)]):
            return self.by_gain[len(indices) - 1]
        if len(indices) == 1:
            return self.single[indices[0]]
        return self.subsets[subset_key(indices)]

    def known_sets(self) -> list[tuple[tuple[int, ...], Answered]]:
        """Every set the record answers (in its prompt order)."""
        sets: list[tuple[tuple[int, ...], Answered]] = [((), self.none)]
        sets += [((idx,), answered) for idx, answered in enumerate(self.single)]
        sets += [(tuple(range(k)), answered) for k, answered in enumerate(self.fixed, 1)]
        sets += [(self.gain_order[:k], answered) for k, answered in enumerate(self.by_gain, 1)]
        sets += [
            (tuple(int(i) for i in key.split(",")), answered)
            for key, answered in self.subsets.items()
        ]
        return sets


@dataclass(frozen=True)
class SetRule:
    """A rule that picks one prompt's chunks per question; ``scores`` if it pays the gain pass."""

    name: str
    pick: Callable[[GainQuestion], Sequence[int]]
    scores: bool = False


def fixed(k: int) -> SetRule:
    """Static top-k."""
    return SetRule(f"top-{k}", lambda q: range(min(k, q.max_k)))


def by_gain(threshold: float, order: GainOrder) -> SetRule:
    """The chunks whose gain reaches τ (at least the best one), in ``order``."""
    name = f"gain ≥ {threshold:g}, {order} order"
    return SetRule(name, lambda q: kept_chunks(q.gains, threshold, order), scores=True)


def by_gain_then_confidence(threshold: float, confidence: float) -> SetRule:
    """Gain order, adding the kept chunks one at a time until the lens confidence reaches c."""

    def pick(q: GainQuestion) -> list[int]:
        kept = kept_chunks(q.gains, threshold, "gain")
        for k in range(1, len(kept) + 1):
            if q.by_gain_confidence[k - 1] >= confidence:
                return kept[:k]
        return kept

    name = f"gain ≥ {threshold:g}, then confidence ≥ {confidence:g}"
    return SetRule(name, pick, scores=True)


def score_gap(gap: float) -> SetRule:
    """Top-d, d the chunks before the first retrieval-score drop of at least ``gap``."""
    return SetRule(f"score gap {gap:g}", lambda q: range(chunks_before_gap(q.scores, gap)))


def oracle_depth() -> SetRule:
    """The smallest fixed depth whose answer is best against gold (a bound, not a rule)."""

    def pick(q: GainQuestion) -> range:
        best = max(answered.f1 for answered in q.fixed)
        return range(next(k for k, a in enumerate(q.fixed, 1) if a.f1 == best))

    return SetRule("oracle depth", pick)


def oracle_subset(max_chunks: int | None = None) -> SetRule:
    """The best-answering set the record holds of at most ``max_chunks`` (fewest tokens on ties).

    A lower bound on the best of all subsets: the record answers every fixed and by-gain prefix,
    every single chunk, no context, and the sets the thresholds keep, not all 2^K sets.
    """

    def pick(q: GainQuestion) -> tuple[int, ...]:
        limit = q.max_k if max_chunks is None else max_chunks
        sets = [(s, a) for s, a in q.known_sets() if len(s) <= limit]
        return min(sets, key=lambda item: (-item[1].f1, item[1].tokens))[0]

    return SetRule("oracle subset" if max_chunks is None else f"oracle subset ≤ {max_chunks}", pick)


@dataclass(frozen=True)
class SetOutcome:
    """A rule's answers over questions: per-question F1 (points), prompt tokens and seconds."""

    rule: SetRule
    f1: tuple[float, ...]
    tokens: tuple[int, ...]
    chunks: tuple[int, ...]
    seconds: tuple[float, ...]

    @classmethod
    def of(
        cls, rule: SetRule, questions: Sequence[GainQuestion], prefill: Callable[[int], float]
    ) -> SetOutcome:
        """Replay ``rule``; ``prefill(n)`` prices a full prefill of n prompt tokens."""
        f1, tokens, chunks, seconds = [], [], [], []
        for q in questions:
            picked = list(rule.pick(q))
            answered = q.answer(picked)
            f1.append(100 * answered.f1)
            tokens.append(answered.tokens)
            chunks.append(len(picked))
            seconds.append(prefill(answered.tokens) + (q.scoring_s if rule.scores else 0.0))
        return cls(rule, tuple(f1), tuple(tokens), tuple(chunks), tuple(seconds))

    @property
    def mean_f1(self) -> float:
        """Mean gold F1, in points."""
        return float(np.mean(self.f1))

    @property
    def mean_tokens(self) -> float:
        """Mean prompt tokens."""
        return float(np.mean(self.tokens))


def prefill_price(questions: Sequence[GainQuestion]) -> Callable[[int], float]:
    """Seconds of a full prefill of n tokens: a quadratic fit of the timed prefills."""
    a, b, c = static_fit([pair for q in questions for pair in q.static])
    return lambda tokens: a + b * tokens + c * tokens**2


def choose(
    family: Sequence[SetRule], questions: Sequence[GainQuestion], prefill: Callable[[int], float]
) -> SetRule:
    """The member of ``family`` with the largest F1 over fixed top-k at the same mean tokens."""
    max_k = min(q.max_k for q in questions)
    fixed_outcomes = [SetOutcome.of(fixed(k), questions, prefill) for k in range(1, max_k + 1)]

    def gain(rule: SetRule) -> float:
        outcome = SetOutcome.of(rule, questions, prefill)
        at_tokens = fixed_at_tokens(fixed_outcomes, outcome.mean_tokens)
        return outcome.mean_f1 - float(np.mean(at_tokens))

    return max(family, key=gain)


def gain_family(order: GainOrder) -> list[SetRule]:
    """Every τ of :data:`THRESHOLDS` in ``order``."""
    return [by_gain(threshold, order) for threshold in THRESHOLDS]
