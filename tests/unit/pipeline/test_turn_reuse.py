"""A conversation's earlier turns are cached like chunks: a follow-up computes only what it adds."""

from __future__ import annotations

import pytest
import torch

from adarag import AdaRAG
from adarag.engine.prefill_request import PrefillRequest
from adarag.schema import GenerationParams
from tests.unit.engine.helpers import CHUNKS, answer_text

PARAMS = GenerationParams(max_new_tokens=4)
QUESTIONS = ("who was the queen?", "where did she live?", "when did she die?")


@pytest.fixture()
def make_rag(tiny_checkpoints, tiny_config):
    def make(**overrides):
        overrides.setdefault("augment", {"enabled": False})
        return AdaRAG(tiny_config(tiny_checkpoints["llama"], **overrides))

    return make


def _converse(rag, chunks_per_turn):
    """Three turns over the given chunks; returns each turn's history and answer."""
    history: list[tuple[str, str]] = []
    turns = []
    for question, chunks in zip(QUESTIONS, chunks_per_turn, strict=True):
        answer = rag.query(question, chunks=list(chunks), params=PARAMS, history=list(history))
        turns.append((list(history), answer))
        history.append((question, answer.text or "none"))
    return turns


def test_the_third_turn_computes_only_the_turn_it_adds_and_its_question(make_rag):
    rag = make_rag(cache={"store": {"storage_dtype": "float32"}})
    turns = _converse(rag, [CHUNKS] * 3)
    history, answer = turns[2]
    layout = rag.prompts.layout(QUESTIONS[2], CHUNKS, history)
    assert len(layout.history_ids) == 2
    (step,) = answer.trace.steps
    assert step.tiers == ("hard",) * len(CHUNKS)
    new_tokens = len(layout.history_ids[1]) + len(layout.query_ids)
    assert step.num_recomputed_tokens == new_tokens
    assert step.num_processed_tokens == new_tokens
    assert answer.num_cached_tokens == layout.num_tokens - new_tokens
    # the same prompt laid out with the turns in the query suffix recomputes them all
    joined = make_rag(prompt={"enable_turn_reuse": False})
    (joined_step,) = _converse(joined, [CHUNKS] * 3)[2][1].trace.steps
    assert joined_step.num_recomputed_tokens > step.num_recomputed_tokens
    # hard hits stored in float32 are exact: the answer is the full prefill's
    engine = rag.engine
    full = engine.prefill(PrefillRequest(layout, max_new_tokens=PARAMS.max_new_tokens))
    assert answer.text == answer_text(engine, layout, full, PARAMS).strip()


def test_turns_reused_after_other_chunks_at_ratio_one_match_a_full_prefill(make_rag):
    ratio_one = {"recompute_ratio": 1.0}
    store = {"storage_dtype": "float32"}  # hard hits bit-exact
    rag = make_rag(cache={"soft": ratio_one, "independent": ratio_one, "store": store})
    chunks_per_turn = [CHUNKS[:2], CHUNKS[1:], CHUNKS[::-1]]
    turns = _converse(rag, chunks_per_turn)
    history, answer = turns[2]
    layout = rag.prompts.layout(QUESTIONS[2], chunks_per_turn[2], history)
    (step,) = answer.trace.steps
    assert "miss" not in step.tiers  # every chunk was seen in an earlier turn
    engine = rag.engine
    full = engine.prefill(PrefillRequest(layout, max_new_tokens=PARAMS.max_new_tokens))
    assert answer.text == answer_text(engine, layout, full, PARAMS).strip()
    hits = rag.cache.lookup(layout.cached_segments)
    assert hits[-2].tier != "miss"  # the first turn's KV is found, though its chunks changed
    reused = engine.prefill(
        PrefillRequest(
            layout,
            [
                _source(None),
                *(_source(hit.kv, hit.recompute_ratio) for hit in hits),
                _source(None),
            ],
            max_new_tokens=PARAMS.max_new_tokens,
        ),
    )
    torch.testing.assert_close(reused.logits, full.logits, atol=1e-4, rtol=1e-4)


def _source(kv, ratio=0.0):
    from adarag.engine.batch import SegmentSource

    return SegmentSource(kv, ratio)
