"""Stop rules replayed over recorded steps: schedules, prices, the oracle bound, interpolation."""

from __future__ import annotations

import pytest

from adarag.augment.step_cost import StepCostModel
from adarag.evaluation.depth import (
    STABILITY_TOKENS,
    DepthQuestion,
    DepthStep,
    Outcome,
    Prices,
    auroc,
    choose,
    fixed,
    fixed_at_tokens,
    oracle,
    prior,
    signal,
    signal_auroc,
    stable,
    stops_at,
)

CHUNK, QUESTION, SYSTEM = 100, 20, 30


def question(f1s: list[float], answers: list[str] | None = None, confidence=None, scores=None):
    depth = len(f1s)
    answers = answers or [f"answer {k}" for k in range(depth)]
    confidence = confidence or [0.1] * depth
    steps = tuple(
        DepthStep(CHUNK + QUESTION, 0.5, confidence[k], 0.2, answers[k], f1s[k])
        for k in range(depth)
    )
    tokens = tuple(SYSTEM + CHUNK * (k + 1) + QUESTION for k in range(depth))
    scores = tuple(scores or [0.9 - 0.01 * k for k in range(depth)])
    return DepthQuestion("q", scores, tokens, steps, ((tokens[-1], 2.0), (tokens[0], 0.3)))


PRICES = Prices((0.1, 0.001, 0.0), StepCostModel(0.2, 0.002))


def test_step_tokens_follow_the_prompt_sizes():
    q = question([0.0] * 5)
    assert q.processed(0, 1) == CHUNK + QUESTION
    assert q.processed(0, 3) == 3 * CHUNK + QUESTION
    assert q.processed(2, 5) == 3 * CHUNK + QUESTION


def test_a_single_prefill_is_priced_by_the_static_fit_and_steps_add_up():
    q = question([0.0] * 4)
    static = PRICES.schedule(q, [3], compares=False)
    assert static == pytest.approx(0.1 + 0.001 * q.prompt_tokens[2])
    stepwise = PRICES.schedule(q, [1, 2, 3], compares=False)
    assert stepwise == pytest.approx(3 * (0.2 + 0.002 * (CHUNK + QUESTION)))
    compared = PRICES.schedule(q, [1, 2, 3], compares=True)
    assert compared - stepwise == pytest.approx(3 * STABILITY_TOKENS * 0.2)


def test_the_oracle_is_never_worse_than_any_fixed_depth():
    questions = [question([0.0, 1.0, 0.5, 0.0]), question([0.3, 0.3, 0.0, 0.9])]
    best = Outcome.of(oracle(), questions, PRICES)
    for k in range(1, 5):
        assert best.mean_f1 >= Outcome.of(fixed(k), questions, PRICES).mean_f1
    assert best.depth == (2, 4)


def test_confidence_rule_spans_fixed_one_to_fixed_all():
    q = question([0.1, 0.2, 0.3], confidence=[0.2, 0.6, 0.9])
    assert signal("confidence", 0.0, 1).schedule(q) == [1]
    assert signal("confidence", 0.5, 1).schedule(q) == [1, 2]
    assert signal("confidence", 0.5, 3).schedule(q) == [3]  # the first step holds the floor
    assert signal("confidence", 1.1, 1).schedule(q) == [1, 2, 3]


def test_stability_stops_at_the_first_repeated_answer():
    q = question([0.0] * 6, answers=["a", "b", "Paris", "paris.", "c", "d"])
    assert stable(2).schedule(q) == [1, 2, 3, 4]
    assert stable(4).schedule(q) == [3, 4]
    assert stable(2, stride=2).schedule(q) == [1, 3, 5, 6]
    assert stable(5).schedule(q) == [4, 5, 6]


def test_a_decided_stop_prefills_one_chunk_at_a_time_from_the_floor():
    q = question([0.0, 0.5, 1.0, 0.0])
    assert stops_at({"q": 3}, 1, "probe").schedule(q) == [1, 2, 3]
    assert stops_at({"q": 3}, 2, "probe").schedule(q) == [2, 3]
    assert stops_at({"q": 1}, 2, "probe").schedule(q) == [1]
    assert stops_at({"q": 9}, 1, "probe").schedule(q) == [1, 2, 3, 4]
    assert Outcome.of(stops_at({"q": 3}, 1, "probe"), [q], PRICES).f1 == (100.0,)


def test_gap_prior_stops_before_the_first_large_score_drop():
    q = question([0.0] * 5, scores=[0.9, 0.88, 0.6, 0.58, 0.57])
    assert prior(0.1).schedule(q) == [2]
    assert stable(2, start_gap=0.1).schedule(q)[0] == 2
    assert signal("confidence", 1.1, 1, start_gap=0.1).schedule(q) == [2, 3, 4, 5]


def test_fixed_k_interpolates_between_the_depths_that_bracket_the_tokens():
    questions = [question([0.0, 1.0, 1.0]), question([1.0, 0.0, 1.0])]
    outcomes = [Outcome.of(fixed(k), questions, PRICES) for k in (1, 2, 3)]
    assert fixed_at_tokens(outcomes, outcomes[1].mean_tokens) == [100.0, 0.0]
    midway = (outcomes[0].mean_tokens + outcomes[1].mean_tokens) / 2
    assert fixed_at_tokens(outcomes, midway) == pytest.approx([50.0, 50.0])
    assert fixed_at_tokens(outcomes, 1e9) == [100.0, 100.0]


def test_choose_prefers_the_rule_that_beats_fixed_depth():
    # the answer is best at depth 1 when confident there, else at depth 3
    questions = [
        question([1.0, 0.0, 0.0], confidence=[0.9, 0.1, 0.1]),
        question([0.0, 0.0, 1.0], confidence=[0.1, 0.1, 0.1]),
    ]
    family = [signal("confidence", tau, 1) for tau in (0.0, 0.5, 1.1)]
    assert choose(family, questions, PRICES, max_depth=3).name == family[1].name


def test_auroc_is_one_for_a_perfect_ranking_and_a_half_for_ties():
    assert auroc([0.9, 0.8, 0.1], [True, True, False]) == 1.0
    assert auroc([0.1, 0.8, 0.9], [True, True, False]) == 0.0
    assert auroc([0.5, 0.5], [True, False]) == 0.5
    assert auroc([0.5], [True]) is None
    q = question([1.0, 0.0, 1.0], confidence=[0.9, 0.2, 0.8])
    assert signal_auroc([q], "confidence") == 1.0
