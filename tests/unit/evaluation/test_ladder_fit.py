"""The routing ladder's fit: replays that follow the thresholds, thresholds that meet targets."""

from __future__ import annotations

import numpy as np
import pytest

from adarag.engine.routing import ROUTING_FEATURES
from adarag.evaluation.profiling.ladder_fit import (
    Chain,
    LadderShape,
    Rung,
    best_thresholds,
    fit_ladder,
    load_chains,
    path_cost,
    replay,
    save_chains,
)

SHAPE = LadderShape(0.2, (0.4, 1.0))


def _chain(idx: int, agrees_at: dict[float, bool], entropy: float) -> Chain:
    features = (entropy, 0.5, entropy, 0.1, 0.0, 0.3, 6.0)
    assert len(features) == len(ROUTING_FEATURES)
    rungs = tuple(
        Rung(ratio, agrees, features, f"answer {ratio}", int(ratio * 900))
        for ratio, agrees in agrees_at.items()
    )
    return Chain("set", f"q{idx}", 1000, 100, 900, rungs)


def _chains(n: int = 40) -> list[Chain]:
    """Questions whose base answer disagrees exactly when the entropy is high."""
    rng = np.random.default_rng(0)
    out = []
    for idx in range(n):
        entropy = float(rng.uniform(0, 4))
        unsure = entropy > 2.5
        out.append(
            _chain(idx, {0.2: not unsure, 0.4: not unsure or idx % 2 == 0, 1.0: True}, entropy)
        )
    return out


def test_path_cost_pays_only_the_difference_and_the_top_rung_in_full():
    chain = _chain(0, {0.2: True, 0.4: True, 1.0: True}, 1.0)
    assert path_cost(chain, (0.2,)) == pytest.approx((0.2 * 900 + 100) / 1000)
    assert path_cost(chain, (0.2, 0.4)) == pytest.approx((0.4 * 900 + 200) / 1000)
    assert path_cost(chain, (0.2, 0.4, 1.0)) == pytest.approx((0.4 * 900 + 200 + 1000) / 1000)


def test_replay_climbs_while_the_probability_is_below_the_threshold():
    chains = _chains(6)
    probabilities = [[0.9, 0.9], [0.1, 0.9], [0.1, 0.1]] * 2
    result = replay(chains, SHAPE, probabilities, (0.5, 0.5))
    assert result.final_ratio == (0.2, 0.4, 1.0) * 2
    assert result.routed_share == pytest.approx(4 / 6)
    never = replay(chains, SHAPE, probabilities, (0.0, 0.0))
    assert never.final_ratio == (0.2,) * 6 and never.routed_share == 0.0


def test_thresholds_meet_the_target_at_the_least_cost():
    chains = _chains()
    # a model that knows: P = 1 where the base agrees, 0 where not
    probabilities = [[float(c.at(0.2).agrees), float(c.at(0.4).agrees)] for c in chains]
    found = best_thresholds(chains, SHAPE, probabilities, 1.0)
    assert found is not None
    thresholds, result = found
    assert result.agreement == 1.0
    exhaustive = replay(chains, SHAPE, probabilities, (1.01, 1.01))
    assert result.cost < exhaustive.cost  # only the unsure questions climb
    assert best_thresholds(chains, SHAPE, [[0.5, 0.5]] * len(chains), 1.01) is None


def test_fit_ladder_learns_the_signal_and_reports_held_out_agreement():
    chains = _chains(60)
    fitted = fit_ladder(chains, SHAPE, [idx % 4 for idx in range(60)], targets=(0.8, 0.95))
    assert fitted.rungs == (0.4, 1.0) and fitted.base_ratio == 0.2
    low = fitted.models[0].probabilities(np.array([[0.5, 0.5, 0.5, 0.1, 0, 0.3, 6.0]]))[0]
    high = fitted.models[0].probabilities(np.array([[3.9, 0.5, 3.9, 0.1, 0, 0.3, 6.0]]))[0]
    assert low > high  # high entropy: less likely to agree
    for target, (agreement, cost) in zip(fitted.targets, fitted.held_out, strict=True):
        assert agreement >= target and 0 < cost
    assert fitted.held_out[0][1] <= fitted.held_out[1][1]  # a higher target costs more
    assert fitted.thresholds_for(0.9) == fitted.thresholds[1]
    assert fitted.thresholds_for(0.99) is None


def test_chains_survive_a_file_with_a_partial_last_line(tmp_path):
    path = tmp_path / "chains.jsonl"
    chains = _chains(3)
    save_chains(path, chains)
    with path.open("a") as handle:
        handle.write('{"dataset": "set", "qid"')  # a run killed mid-write
    assert load_chains(path) == chains
