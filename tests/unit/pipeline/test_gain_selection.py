"""The ``gain`` stop rule end to end on a tiny model: the chunks kept are the gains' choice."""

from __future__ import annotations

import logging

import pytest
import torch

from adarag import AdaRAG, Chunk
from adarag.augment.gain import DEFAULT_THRESHOLD, kept_chunks
from adarag.evaluation.reuse import independent_chunks
from adarag.pipeline.prompt import CITATION_KEY
from adarag.profiles import generic_profile
from adarag.profiles.gain import GainCalibration
from adarag.schema import GenerationParams
from tests.unit.engine.helpers import CHUNKS, QUESTION

PARAMS = GenerationParams(max_new_tokens=3)
EXACT_STORE = {"store": {"storage_dtype": "float32"}}  # the stored KV is what was computed


@pytest.fixture()
def make_rag(tiny_checkpoints, tiny_config):
    def make(augment=None, prompt=None, **levers):
        return AdaRAG(
            tiny_config(
                tiny_checkpoints["llama"],
                cache=EXACT_STORE,
                augment={"stop_rule": "gain", **(augment or {})},
                prompt=prompt or {},
                experimental={"augment": levers},
            )
        )

    return make


def _gains_by_hand(rag: AdaRAG, top_k: int = 20) -> list[float]:
    """Each chunk's gain: the pass over the cached contexts, the top-K entropy in torch."""
    layout = rag.layout(QUESTION, CHUNKS)
    system_kv, chunk_kvs = independent_chunks(rag.engine, layout)
    contexts = [[system_kv], *([system_kv, kv] for kv in chunk_kvs)]
    logits = rag.engine.query_over_contexts(layout.query_ids, contexts).logits
    log_p = torch.log_softmax(logits.topk(top_k, dim=-1).values.double(), dim=-1)
    entropy = -(log_p.exp() * log_p).sum(dim=-1) / torch.log(torch.tensor(float(top_k)))
    return [float(entropy[0] - value) for value in entropy[1:]]


def _between(gains: list[float]) -> float:
    """A τ that keeps the best gain and drops the worst."""
    ranked = sorted(gains, reverse=True)
    return (ranked[0] + ranked[1]) / 2


def _kept(gains: list[float], threshold: float, order: str = "gain") -> tuple[Chunk, ...]:
    return tuple(Chunk(CHUNKS[idx]) for idx in kept_chunks(gains, threshold, order))


@pytest.mark.parametrize("order", ["gain", "retrieval"])
def test_the_answer_keeps_exactly_the_chunks_whose_gain_reaches_tau(make_rag, order):
    probe = make_rag()
    gains = _gains_by_hand(probe)
    threshold = min(gains) + 1e-6  # drops the worst chunk, keeps the other two
    rag = make_rag(gain_threshold=threshold, gain_order=order)
    answer = rag.query(QUESTION, chunks=list(CHUNKS), params=PARAMS)
    trace = answer.trace
    assert trace.chunk_gains == pytest.approx(gains, abs=1e-5)
    assert answer.chunks == _kept(list(trace.chunk_gains), threshold, order)
    assert len(answer.chunks) == 2
    assert trace.stop_reason == "gain" and len(trace.steps) == 1
    assert trace.gain_s is not None and trace.gain_s > 0
    # the prompt is laid out again from the kept chunks alone
    assert trace.num_prompt_tokens == rag.layout(QUESTION, answer.chunks).num_tokens


def test_the_two_orders_list_the_kept_chunks_differently(make_rag):
    gains = _gains_by_hand(make_rag())
    assert sorted(range(3), key=lambda idx: -gains[idx]) != [0, 1, 2]  # else no difference
    by_gain = make_rag(gain_threshold=-1.0).query(QUESTION, chunks=list(CHUNKS), params=PARAMS)
    as_retrieved = make_rag(gain_threshold=-1.0, gain_order="retrieval").query(
        QUESTION, chunks=list(CHUNKS), params=PARAMS
    )
    assert as_retrieved.chunks == tuple(Chunk(text) for text in CHUNKS)
    assert by_gain.chunks == _kept(gains, -1.0, "gain") != as_retrieved.chunks


def test_a_tau_above_every_gain_keeps_the_best_chunk_where_static_keeps_all(make_rag):
    gains = _gains_by_hand(make_rag())
    gained = make_rag(gain_threshold=1.0).query(QUESTION, chunks=list(CHUNKS), params=PARAMS)
    static = make_rag(augment={"enabled": False}).query(
        QUESTION, chunks=list(CHUNKS), params=PARAMS
    )
    best = max(range(len(CHUNKS)), key=lambda idx: gains[idx])
    assert gained.chunks == (Chunk(CHUNKS[best]),)
    assert static.chunks == tuple(Chunk(text) for text in CHUNKS)
    assert gained.trace.num_prompt_tokens < static.trace.num_prompt_tokens
    assert static.trace.chunk_gains is None and static.trace.stop_reason == "static"


def test_min_chunks_keeps_the_best_gains_when_fewer_reach_tau(make_rag):
    gains = _gains_by_hand(make_rag())
    rag = make_rag(gain_threshold=1.0, min_chunks=2)
    answer = rag.query(QUESTION, chunks=list(CHUNKS), params=PARAMS)
    assert answer.chunks == tuple(
        Chunk(CHUNKS[idx]) for idx in kept_chunks(gains, 1.0, "gain", min_chunks=2)
    )
    assert len(answer.chunks) == 2


def test_gain_confidence_adds_the_kept_chunks_one_at_a_time(make_rag):
    gains = _gains_by_hand(make_rag())
    never = make_rag(gain_threshold=-1.0, gain_confidence=1.0)
    answer = never.query(QUESTION, chunks=list(CHUNKS), params=PARAMS)
    assert [step.num_chunks for step in answer.trace.steps] == [1, 2, 3]
    assert answer.trace.stop_reason == "exhausted"
    assert answer.chunks == _kept(gains, -1.0)
    assert answer.trace.chunk_gains is not None
    first = make_rag(gain_threshold=-1.0, gain_confidence=0.0)
    answer = first.query(QUESTION, chunks=list(CHUNKS), params=PARAMS)
    assert answer.trace.stop_reason == "confident" and len(answer.trace.steps) == 1
    assert answer.chunks == _kept(gains, -1.0)[:1]


def test_without_a_fitted_tau_the_hand_made_one_is_used_and_said_once(make_rag, caplog):
    gains = _gains_by_hand(make_rag())
    rag = make_rag()
    with caplog.at_level(logging.INFO, logger="adarag.pipeline.rag"):
        for _ in range(2):
            answer = rag.query(QUESTION, chunks=list(CHUNKS), params=PARAMS)
    assert answer.chunks == _kept(gains, DEFAULT_THRESHOLD)
    said = [r for r in caplog.records if "no gain threshold calibrated" in r.getMessage()]
    assert len(said) == 1 and "τ=0.05" in said[0].getMessage()


def test_the_profiles_fitted_tau_and_then_the_configs_are_used(make_rag, caplog):
    probe = make_rag()
    gains = _gains_by_hand(probe)
    fitted = min(gains) + 1e-6
    profile = generic_profile("tiny", probe.engine.fingerprint, probe.engine.spec.num_layers)
    calibration = GainCalibration(fitted, "gain", 40, ("musique",), 2.5)
    folder = probe.config.home / "profiles"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{probe.engine.fingerprint}.json").write_text(
        profile.with_learned(gain=calibration).to_json()
    )
    with caplog.at_level(logging.INFO, logger="adarag.pipeline.rag"):
        answer = make_rag().query(QUESTION, chunks=list(CHUNKS), params=PARAMS)
    assert answer.chunks == _kept(gains, fitted)
    assert "no gain threshold calibrated" not in caplog.text
    overridden = make_rag(gain_threshold=1.0).query(QUESTION, chunks=list(CHUNKS), params=PARAMS)
    assert overridden.chunks == _kept(gains, 1.0)
    with caplog.at_level(logging.INFO, logger="adarag.pipeline.rag"):
        make_rag(gain_order="retrieval").query(QUESTION, chunks=list(CHUNKS), params=PARAMS)
    assert "was chosen for gain order; experimental.augment.gain_order is 'retrieval'" in (
        caplog.text
    )


def test_citations_number_the_kept_chunks(make_rag):
    every = make_rag(prompt={"citations": True}, gain_threshold=-1.0)
    gains = every.query(QUESTION, chunks=list(CHUNKS), params=PARAMS).trace.chunk_gains
    assert gains is not None  # the citation instruction is in the question: gains of their own
    cited = make_rag(prompt={"citations": True}, gain_threshold=min(gains) + 1e-6)
    answer = cited.query(QUESTION, chunks=list(CHUNKS), params=PARAMS)
    assert answer.chunks[0].text == CHUNKS[max(range(3), key=lambda idx: gains[idx])]
    assert [chunk.metadata[CITATION_KEY] for chunk in answer.chunks] == [1, 2]
    assert answer.trace.num_prompt_tokens == cited.layout(QUESTION, answer.chunks).num_tokens
