"""Replaying chunk selection by gain over recorded questions reads each rule's own prompt."""

from __future__ import annotations

import pytest

from adarag.evaluation.gain_depth import (
    GainQuestion,
    SetOutcome,
    by_gain,
    by_gain_then_confidence,
    choose,
    fixed,
    gain_family,
    oracle_subset,
    prefill_price,
    score_gap,
)
from tests.unit.profiles.test_calibrate_gain import GAIN_ORDER, GAINS, GOLD, _record


def _question(number: int = 0) -> GainQuestion:
    return GainQuestion.from_record(_record(number))


def test_each_set_is_answered_from_its_own_prompt():
    q = _question()
    assert q.answer([]) == q.none
    assert q.answer([0, 1, 2]) == q.fixed[2]
    assert q.answer(GAIN_ORDER[:3]) == q.by_gain[2]
    assert q.answer([GOLD]) == q.single[GOLD]
    kept = sorted(GAIN_ORDER[:4])  # the gold chunk is 4th by gain
    assert q.answer(kept).f1 == 0.8 and q.answer(kept).tokens == 60
    with pytest.raises(KeyError):
        q.answer([7, 0])  # no record holds that prompt


def test_rules_pick_different_prompts_and_are_priced_by_them():
    questions = [_question(number) for number in range(4)]
    price = prefill_price(questions)
    gain_order = SetOutcome.of(by_gain(0.1, "gain"), questions, price)
    retrieval = SetOutcome.of(by_gain(0.1, "retrieval"), questions, price)
    top4 = SetOutcome.of(fixed(4), questions, price)
    # the same chunks in another order are another prompt: the records answer them apart
    assert gain_order.chunks == retrieval.chunks == (4, 4, 4, 4)
    assert gain_order.mean_f1 == 100 and retrieval.mean_f1 == 80 and top4.mean_f1 == 40
    # a gain rule pays its scoring pass on top of the prefill of as many tokens
    assert all(g > f for g, f in zip(gain_order.seconds, top4.seconds, strict=True))
    # scores fall by 0.1 a chunk: a gap of 0.05 stops after the first, one of 0.15 never
    assert SetOutcome.of(score_gap(0.05), questions, price).chunks == (1, 1, 1, 1)
    assert SetOutcome.of(score_gap(0.15), questions, price).chunks == (8, 8, 8, 8)


def test_choose_takes_the_threshold_above_fixed_and_the_oracle_bounds_it():
    questions = [_question(number) for number in range(4)]
    price = prefill_price(questions)
    chosen = choose([*gain_family("gain"), *gain_family("retrieval")], questions, price)
    assert chosen.name == "gain ≥ 0.1, gain order"
    best = SetOutcome.of(oracle_subset(), questions, price)
    assert best.mean_f1 == 100 and best.chunks == (1, 1, 1, 1)  # the gold chunk alone
    confident = SetOutcome.of(by_gain_then_confidence(0.0, 0.4), questions, price)
    assert confident.chunks == (1, 1, 1, 1)  # every step's confidence (0.5) stops at once
    assert max(GAINS) == GAINS[GAIN_ORDER[0]]
