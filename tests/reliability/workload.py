"""Requests for the concurrency and soak tests, and the cache setting that makes answers order-free.

Why the order requests run in cannot change an answer under :data:`EXACT_TIERS`: a soft or
independent hit is recomputed at ratio 1.0, i.e. in full, so the only KV ever reused as is is a
hard hit -- KV computed after exactly the same prefix, itself exact by induction (every entry is
written back from a prefill whose sources were all exact, or by ``warm``, which computes a chunk
alone). So whatever the cache holds when a request runs, and whichever tier answers, the request's
prefill equals a full prefill of its prompt up to float rounding (matmuls over different row
counts; ~1e-7 relative), and greedy decoding picks the same tokens unless two logits tie within
that rounding, which the fixed requests here never do. The default ratios (0.1 and 0.2) would
make answers depend on what happened to be cached, and a concurrent run could not be compared
with a serial one.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from adarag import AdaRAG, Answer

EXACT_TIERS = {"soft": {"recompute_ratio": 1.0}, "independent": {"recompute_ratio": 1.0}}
"""Cache tiers whose answers do not depend on the cache's state (see the module docstring)."""

EXACT_STORE = {"storage_dtype": "float32"}
"""Stored KV kept bit-exact, so a hard hit equals the prefill that stored it."""

STEPWISE = {"stop_rule": "confidence", "threshold": 1.0}
"""Augmentation that adds every chunk as its own step: a write-back between steps."""

POOL = (
    "paris is the capital of france and the seine runs through it.",
    "berlin is the capital of germany; the spree runs through berlin.",
    "the quick brown fox jumps over the lazy dog near the river.",
    "madrid is the capital of spain, and the sun shines there.",
    "the lazy dog sleeps all day while the brown fox runs around.",
    "rome is the capital of italy; the tiber runs through rome.",
)
"""The retriever's corpus; random requests draw their chunks from it."""

QUESTIONS = (
    "what is the capital of france?",
    "which river runs through berlin?",
    "what does the quick brown fox do?",
    "where does the sun shine?",
    "what does the lazy dog do?",
    "which river runs through rome?",
)

# Chunks only the designed requests use, so that their tiers are fixed whatever the order.
SOFT_CHUNKS = (
    "question: the first soft chunk is about paris.",
    "question: the second soft chunk is about berlin.",
    "question: the third soft chunk is about the fox.",
    "question: the fourth soft chunk is about the dog.",
)
INDEPENDENT_CHUNKS = (
    "answer: an independent chunk about 0123 abcd.",
    "answer: a warmed chunk about 4567 ABCD, never seen after the other.",
)


@dataclass(frozen=True)
class Request:
    """One question: its chunks, or None for the retriever's ``top_k``."""

    question: str
    chunks: tuple[str, ...] | None = None
    top_k: int | None = None


@dataclass(frozen=True)
class Result:
    """What an answer is compared on: its text and the chunks it used."""

    text: str
    chunks: tuple[str, ...]

    @classmethod
    def of(cls, answer: Answer) -> Result:
        return cls(answer.text, tuple(chunk.text for chunk in answer.chunks))


def ask(rag: AdaRAG, request: Request, params, *, stream: bool = False) -> Answer:
    """Answer ``request`` with ``query``, or with ``stream`` read to its end."""
    chunks = list(request.chunks) if request.chunks is not None else None
    if not stream:
        return rag.query(request.question, chunks=chunks, params=params, top_k=request.top_k)
    answer_stream = rag.stream(request.question, chunks=chunks, params=params, top_k=request.top_k)
    text = "".join(answer_stream)
    answer = answer_stream.answer()
    assert answer.text == text.strip()
    return answer


def seed(rag: AdaRAG, params) -> list[Answer]:
    """What both runs do first, serially: warm a few chunks and answer one designed request.

    After it, the soft chunks' prompt ``[s1, s2, s3]`` is cached and the second independent
    chunk is warmed, which :func:`designed_requests` rely on.
    """
    rag.warm([INDEPENDENT_CHUNKS[1], POOL[0], POOL[2]])
    return [rag.query(QUESTIONS[0], chunks=list(SOFT_CHUNKS[:3]), params=params)]


def designed_requests() -> list[tuple[Request, str]]:
    """Requests whose last chunk hits a given tier (after :func:`seed`), in any order.

    ``[s1, s4, s2, s3]``: at the last step ``s3`` follows ``s2`` as in the seed's prompt, under
    another prefix: a soft hit (no other request has that prefix). ``[i0, i1]``: ``i1`` was
    warmed and follows ``i0`` nowhere else: an independent hit. Every step after the first of a
    stepwise request finds the previous steps' chunks as hard hits.
    """
    soft = Request(QUESTIONS[2], (SOFT_CHUNKS[0], SOFT_CHUNKS[3], SOFT_CHUNKS[1], SOFT_CHUNKS[2]))
    independent = Request(QUESTIONS[4], INDEPENDENT_CHUNKS)
    return [(soft, "soft"), (independent, "independent")]


def random_requests(rng: random.Random, count: int) -> list[Request]:
    """Requests over :data:`POOL`: 1-4 chunks in random order, or the retriever's top 1-3."""
    requests = []
    for _ in range(count):
        question = rng.choice(QUESTIONS)
        if rng.random() < 0.25:
            requests.append(Request(question, None, rng.randint(1, 3)))
        else:
            requests.append(Request(question, tuple(rng.sample(POOL, rng.randint(1, 4)))))
    return requests


def workload(seed_value: int, count: int) -> list[Request]:
    """``count`` requests: the designed ones, random ones, and repeats of random ones (the same
    prompt twice, maybe at once), shuffled."""
    rng = random.Random(seed_value)
    designed = [request for request, _ in designed_requests()]
    assert count > len(designed), "a workload holds the designed requests and more"
    randoms = random_requests(rng, max(count // 2 - len(designed), 1))
    distinct = designed + randoms
    requests = distinct + [rng.choice(randoms) for _ in range(count - len(distinct))]
    rng.shuffle(requests)
    return requests[:count]


def deal(items: Sequence[object], hands: int) -> list[list[int]]:
    """Indices of ``items`` dealt round-robin into ``hands`` hands."""
    return [list(range(hand, len(items), hands)) for hand in range(hands)]


def tiers_of(answers: Sequence[Answer]) -> Iterator[str]:
    """Every tier lookup the answers' prefills made."""
    for answer in answers:
        for step in answer.trace.steps:
            yield from step.tiers
