"""SQuAD-style answer metrics against hand-computed cases."""

from __future__ import annotations

import pytest

from adarag.evaluation.metrics import (
    best_exact_match,
    best_f1,
    exact_match,
    normalize_answer,
    token_f1,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The Eiffel Tower!", "eiffel tower"),
        ("  an   apple, a pear ", "apple pear"),
        ("Theater", "theater"),  # 'the' only as a whole word
        ("", ""),
    ],
)
def test_normalisation(text, expected):
    assert normalize_answer(text) == expected


def test_exact_match_ignores_case_punctuation_and_articles():
    assert exact_match("The Beatles.", "beatles") == 1.0
    assert exact_match("Beatles band", "beatles") == 0.0


def test_token_f1_hand_computed():
    # prediction tokens: [paris, is, capital] ; reference: [paris, france]
    # common = 1, precision = 1/3, recall = 1/2 -> F1 = 2 * (1/6) / (5/6) = 0.4
    assert token_f1("Paris is the capital", "Paris, France") == pytest.approx(0.4)
    assert token_f1("x", "y") == 0.0
    assert token_f1("", "") == 1.0
    assert token_f1("b", "") == 0.0


def test_best_over_references():
    refs = ["Exeter College", "Oxford"]
    assert best_f1("educated at Exeter College", refs) == pytest.approx(
        2 * (2 / 4) * 1 / (2 / 4 + 1)
    )
    assert best_exact_match("oxford", refs) == 1.0
    assert best_f1("anything", []) == 0.0
