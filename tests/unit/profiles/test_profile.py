"""Attention-sink analysis on synthetic chunk-attention matrices, and profile files."""

from __future__ import annotations

import pytest
import torch

from adarag.errors import ConfigError
from adarag.evaluation.profiling.sinks import analyse_chunk_attention, bands_of
from adarag.profiles import Calibration, LayerBand, ModelProfile, find_profile

NUM_CHUNKS = 6
SEGMENTS = NUM_CHUNKS + 2


def _layer(sink_weight: float) -> torch.Tensor:
    """Each chunk attends to itself, its predecessor (1.0) and chunk 1 (sink_weight)."""
    table = torch.zeros(SEGMENTS, SEGMENTS)
    for row in range(SEGMENTS):
        table[row, 0] = 1.0
        table[row, row] = 2.0
        if row >= 2:
            for col in range(1, row - 1):
                table[row, col] = 0.1
            table[row, row - 1] = 1.0
            if row >= 3:
                table[row, 1] = sink_weight
    return table / table.sum(-1, keepdim=True)


def test_predecessor_local_attention_has_no_sink():
    attention = torch.stack([_layer(0.1) for _ in range(6)])
    patterns, _, _, sink = analyse_chunk_attention(attention)
    assert set(patterns) == {"predecessor"}
    assert sink is None


def test_sink_band_is_found_with_its_chunk():
    weights = [0.1, 0.1, 1.2, 1.2, 1.2, 0.1, 0.1, 0.1]
    attention = torch.stack([_layer(w) for w in weights])
    patterns, predecessor, sink_share, sink = analyse_chunk_attention(attention)
    assert bands_of(patterns) == (
        LayerBand(0, 2, "predecessor"),
        LayerBand(2, 5, "sink"),
        LayerBand(5, 8, "predecessor"),
    )
    assert sink == 0
    assert sink_share[3] > predecessor[3]


def test_one_layer_blips_are_smoothed_away():
    weights = [0.1, 0.1, 0.1, 1.2, 0.1, 0.1]
    patterns, *_ = analyse_chunk_attention(torch.stack([_layer(w) for w in weights]))
    assert set(patterns) == {"predecessor"}


def test_too_few_chunks_is_an_error():
    with pytest.raises(ConfigError, match="at least 4 chunks"):
        analyse_chunk_attention(torch.rand(3, 5, 5))


def test_profile_json_round_trip_and_lookup(tmp_path):
    profile = ModelProfile(
        "m",
        "f" * 16,
        8,
        2,
        0,
        (LayerBand(0, 2, "predecessor"), LayerBand(2, 8, "sink")),
        calibration=Calibration(threshold=0.7, kl_weight=0.3),
    )
    path = tmp_path / f"{'f' * 16}.json"
    path.write_text(profile.to_json())
    assert find_profile("m", "f" * 16, 8, [tmp_path]) == profile
    assert find_profile("unknown-model", "0" * 16, 8, [tmp_path]) is None
    path.write_text("{}")
    with pytest.raises(ConfigError, match="not a valid adarag model profile"):
        find_profile("m", "f" * 16, 8, [tmp_path])


def test_the_default_model_ships_a_profile():
    profile = find_profile("SmolLM2-135M-Instruct", "not-this-one", 30, [])
    assert profile is not None and profile.num_layers == 30
