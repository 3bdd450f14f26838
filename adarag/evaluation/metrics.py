"""Answer metrics with SQuAD normalisation: exact match and token F1."""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower-case, strip punctuation and articles, collapse whitespace (SQuAD v1.1)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, reference: str) -> float:
    """1.0 when the normalised strings are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(reference))


def token_f1(prediction: str, reference: str) -> float:
    """Harmonic mean of token precision and recall of the normalised strings."""
    predicted, expected = normalize_answer(prediction).split(), normalize_answer(reference).split()
    if not predicted or not expected:
        return float(predicted == expected)
    common = sum((Counter(predicted) & Counter(expected)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


def best_exact_match(prediction: str, references: Sequence[str]) -> float:
    """Exact match against the best-matching reference."""
    return max((exact_match(prediction, ref) for ref in references), default=0.0)


def best_f1(prediction: str, references: Sequence[str]) -> float:
    """Token F1 against the best-matching reference."""
    return max((token_f1(prediction, ref) for ref in references), default=0.0)
