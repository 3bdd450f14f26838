"""Adaptive depth against fixed top-k: stop rules replayed over every recorded step.

A question's record holds every augmentation step k = 1..K (each step's answer is the
full-recomputation answer of static top-k) with its signals. A stop rule is then a *schedule*:
the depths it prefills, the last one answering. Replaying a schedule gives the rule's answer
exactly; its time is priced from fits measured in the same run:

- a single prefill of depth d (fixed top-k, or the zero-cost score-gap prior) costs the static fit
  ``a + b n + c n^2`` of the timed full prefills at n prompt tokens;
- an augmentation step from depth a to b costs the step fit ``fixed + per_token x processed``
  (processed: the new chunks' tokens and the question's), and a rule that compares answers pays
  ``STABILITY_TOKENS`` decoded tokens per step, each priced as one step's fixed cost.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from adarag.augment.prior import chunks_before_gap
from adarag.augment.step_cost import StepCostModel
from adarag.evaluation.metrics import normalize_answer

STABILITY_TOKENS = 4


@dataclass(frozen=True)
class DepthStep:
    """Step k of one question: the answer from the top-k chunks and the signals seen then."""

    processed: int
    step_s: float
    confidence: float | None
    margin: float | None
    answer: str
    f1: float


@dataclass(frozen=True)
class DepthQuestion:
    """Every step of one question, its retrieval scores and prompt sizes (index k - 1)."""

    qid: str
    scores: tuple[float, ...]
    prompt_tokens: tuple[int, ...]
    steps: tuple[DepthStep, ...]
    static: tuple[tuple[int, float], ...]
    """Timed full prefills: (prompt tokens, seconds)."""

    @classmethod
    def from_record(cls, row: dict) -> DepthQuestion:
        """A question as ``benchmarks/depth.py run`` writes it."""
        return cls(
            row["qid"],
            tuple(row["scores"]),
            tuple(row["prompt_tokens"]),
            tuple(
                DepthStep(
                    s["processed"], s["step_s"], s["confidence"], s["margin"], s["answer"], s["f1"]
                )
                for s in row["steps"]
            ),
            tuple((s["tokens"], s["seconds"]) for s in row["static"]),
        )

    @property
    def max_depth(self) -> int:
        """Steps recorded (the deepest prompt's chunks)."""
        return len(self.steps)

    def processed(self, start: int, end: int) -> int:
        """Tokens a step from depth ``start`` (0: nothing cached) to ``end`` processes.

        Step 1 processed its chunk and the question; step 2 its chunk and the question, so the
        question's share is step 2's tokens less chunk 2's.
        """
        tokens = self.prompt_tokens
        if start == 0:
            return self.steps[0].processed + tokens[end - 1] - tokens[0]
        question = self.steps[1].processed - (tokens[1] - tokens[0])
        return tokens[end - 1] - tokens[start - 1] + question


def static_fit(timed: Sequence[tuple[int, float]]) -> tuple[float, float, float]:
    """``(a, b, c)`` of ``a + b n + c n^2`` seconds for a full prefill of n tokens."""
    n = np.array([tokens for tokens, _ in timed], dtype=np.float64)
    c, b, a = np.polyfit(n, np.array([seconds for _, seconds in timed]), 2)
    return float(a), float(b), float(c)


@dataclass(frozen=True)
class Prices:
    """Seconds of a full prefill of n tokens (quadratic fit) and of an augmentation step."""

    static: tuple[float, float, float]
    step: StepCostModel

    @classmethod
    def fit(cls, questions: Sequence[DepthQuestion]) -> Prices:
        """Both fits over every timed prefill and step of ``questions``."""
        static = static_fit([pair for q in questions for pair in q.static])
        tokens = [step.processed for q in questions for step in q.steps[1:]]
        seconds = [step.step_s for q in questions for step in q.steps[1:]]
        return cls(static, StepCostModel.fit(tokens, seconds))

    def full_prefill(self, tokens: int) -> float:
        """Seconds of a full prefill of ``tokens`` prompt tokens."""
        a, b, c = self.static
        return a + b * tokens + c * tokens**2

    def schedule(self, question: DepthQuestion, depths: Sequence[int], compares: bool) -> float:
        """Seconds to the first token of a rule that prefills ``depths`` in turn."""
        if len(depths) == 1 and not compares:
            return self.full_prefill(question.prompt_tokens[depths[0] - 1])
        seconds, start = 0.0, 0
        for depth in depths:
            seconds += self.step(question.processed(start, depth))
            start = depth
        if compares:
            seconds += len(depths) * STABILITY_TOKENS * self.step.fixed_s
        return seconds


@dataclass(frozen=True)
class Rule:
    """A stop rule with its parameters: the depths it prefills for a question."""

    name: str
    schedule: Callable[[DepthQuestion], list[int]]
    compares_answers: bool = False


def fixed(k: int) -> Rule:
    """Static top-k."""
    return Rule(f"top-{k}", lambda q: [min(k, q.max_depth)])


def prior(gap: float) -> Rule:
    """Static top-d, d chunks before the first retrieval-score drop of at least ``gap``."""
    return Rule(f"gap prior {gap:g}", lambda q: [chunks_before_gap(q.scores, gap)])


def _depths(q: DepthQuestion, first: int, stride: int) -> list[int]:
    """``first``, then every ``stride`` chunks, ending with all of them."""
    first = min(max(first, 1), q.max_depth)
    depths = list(range(first, q.max_depth + 1, stride))
    return depths if depths[-1] == q.max_depth else [*depths, q.max_depth]


def _start(q: DepthQuestion, depth: int, start_gap: float | None) -> int:
    """``depth``, or the gap prior's depth when it is deeper."""
    return depth if start_gap is None else max(depth, chunks_before_gap(q.scores, start_gap))


def _from(start_gap: float | None) -> str:
    return "" if start_gap is None else f", from gap prior {start_gap:g}"


def signal(name: str, threshold: float, floor: int, start_gap: float | None = None) -> Rule:
    """Steps of one chunk from ``floor`` (or the gap prior's depth); stop once ``name`` ≥ τ."""

    def schedule(q: DepthQuestion) -> list[int]:
        visited: list[int] = []
        for depth in _depths(q, _start(q, floor, start_gap), 1):
            visited.append(depth)
            value = getattr(q.steps[depth - 1], name)
            if value is not None and value >= threshold:
                break
        return visited

    return Rule(f"{name} ≥ {threshold:.2f} from {floor}{_from(start_gap)}", schedule)


def stable(floor: int, stride: int = 1, start_gap: float | None = None) -> Rule:
    """Steps of ``stride`` chunks until two consecutive answers agree, never before ``floor``.

    The first step holds ``floor - stride`` chunks (at least one; or the gap prior's depth), so
    that a stop at ``floor`` is possible. Two steps agree when their answers' first
    ``STABILITY_TOKENS`` words are equal (normalised), TASR's answer stability.
    """

    def schedule(q: DepthQuestion) -> list[int]:
        visited: list[int] = []
        for depth in _depths(q, _start(q, floor - stride, start_gap), stride):
            visited.append(depth)
            if depth >= floor and len(visited) > 1 and _same(q, visited[-2], depth):
                break
        return visited

    name = f"stable from {floor}, stride {stride}{_from(start_gap)}"
    return Rule(name, schedule, compares_answers=True)


def _same(q: DepthQuestion, a: int, b: int) -> bool:
    def head(depth: int) -> list[str]:
        return normalize_answer(q.steps[depth - 1].answer).split()[:STABILITY_TOKENS]

    return head(a) == head(b)


def stops_at(stops: Mapping[str, int], floor: int, name: str) -> Rule:
    """Steps of one chunk from ``floor`` to each question's stop in ``stops`` (by qid).

    For a rule decided elsewhere from the steps' own features, e.g. the depth probe replayed
    over its records (:mod:`adarag.evaluation.profiling.depth_probe`).
    """

    def schedule(q: DepthQuestion) -> list[int]:
        stop = min(stops[q.qid], q.max_depth)
        return list(range(min(floor, stop), stop + 1))

    return Rule(name, schedule)


def oracle() -> Rule:
    """The smallest depth whose answer is best against gold (a bound, not a rule)."""

    def schedule(q: DepthQuestion) -> list[int]:
        best = max(step.f1 for step in q.steps)
        return [next(d for d, step in enumerate(q.steps, 1) if step.f1 == best)]

    return Rule("oracle depth", schedule)


@dataclass(frozen=True)
class Outcome:
    """A rule's answers over questions: per-question F1, prompt tokens, depth and seconds."""

    rule: Rule
    f1: tuple[float, ...]
    tokens: tuple[int, ...]
    depth: tuple[int, ...]
    seconds: tuple[float, ...]

    @classmethod
    def of(cls, rule: Rule, questions: Sequence[DepthQuestion], prices: Prices) -> Outcome:
        """Replay ``rule`` on every question."""
        f1, tokens, depth, seconds = [], [], [], []
        for q in questions:
            depths = rule.schedule(q)
            last = depths[-1]
            f1.append(100 * q.steps[last - 1].f1)
            tokens.append(q.prompt_tokens[last - 1])
            depth.append(last)
            seconds.append(prices.schedule(q, depths, rule.compares_answers))
        return cls(rule, tuple(f1), tuple(tokens), tuple(depth), tuple(seconds))

    @property
    def mean_tokens(self) -> float:
        """Mean prompt tokens of the answering prefill."""
        return float(np.mean(self.tokens))

    @property
    def mean_f1(self) -> float:
        """Mean gold F1, in points."""
        return float(np.mean(self.f1))


def auroc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    """How well ``scores`` rank the positive labels first (0.5: chance), ties counted half.

    None when either class is empty.
    """
    positive = [s for s, label in zip(scores, labels, strict=True) if label]
    negative = [s for s, label in zip(scores, labels, strict=True) if not label]
    if not positive or not negative:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in positive for n in negative)
    return wins / (len(positive) * len(negative))


def signal_auroc(
    questions: Sequence[DepthQuestion], name: str, min_f1: float = 0.5
) -> float | None:
    """AUROC of a step signal for "this step's answer reaches ``min_f1``", over every step."""
    pairs = [
        (float(getattr(step, name)), step.f1 >= min_f1)
        for q in questions
        for step in q.steps
        if getattr(step, name) is not None
    ]
    return auroc([s for s, _ in pairs], [label for _, label in pairs])


class MeanOutcome(Protocol):
    """A rule's per-question F1 and its mean prompt tokens (an :class:`Outcome` or alike)."""

    @property
    def f1(self) -> tuple[float, ...]:
        """Gold F1 of each question, in points."""
        ...

    @property
    def mean_tokens(self) -> float:
        """Mean prompt tokens."""
        ...


def fixed_at_tokens(fixed_outcomes: Sequence[MeanOutcome], mean_tokens: float) -> list[float]:
    """Per-question F1 of fixed top-k interpolated to ``mean_tokens`` (clamped at the ends).

    The two fixed depths whose mean prompt tokens bracket ``mean_tokens`` are mixed with the one
    weight that matches the mean, the same for every question (so the result pairs with a rule's
    per-question F1).
    """
    ordered = sorted(fixed_outcomes, key=lambda o: o.mean_tokens)
    if mean_tokens <= ordered[0].mean_tokens:
        return list(ordered[0].f1)
    for low, high in zip(ordered, ordered[1:], strict=False):
        if mean_tokens <= high.mean_tokens:
            weight = (mean_tokens - low.mean_tokens) / (high.mean_tokens - low.mean_tokens)
            return [(1 - weight) * a + weight * b for a, b in zip(low.f1, high.f1, strict=True)]
    return list(ordered[-1].f1)


def gain_over_fixed(outcome: Outcome, fixed_outcomes: Sequence[Outcome]) -> float:
    """Mean F1 of ``outcome`` minus fixed top-k's at the same mean prompt tokens."""
    return outcome.mean_f1 - float(np.mean(fixed_at_tokens(fixed_outcomes, outcome.mean_tokens)))


def choose(
    family: Sequence[Rule], questions: Sequence[DepthQuestion], prices: Prices, max_depth: int
) -> Rule:
    """The member of ``family`` with the largest F1 gain over fixed top-k on ``questions``."""
    fixed_outcomes = [Outcome.of(fixed(k), questions, prices) for k in range(1, max_depth + 1)]
    return max(
        family,
        key=lambda rule: gain_over_fixed(Outcome.of(rule, questions, prices), fixed_outcomes),
    )
