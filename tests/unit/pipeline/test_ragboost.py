"""RAGBoost in the pipeline: longest-cached-prefix order, order hint, scheduling, de-duplication.

Each test fails if its mechanism is absent: the hard hits of a reordered prompt are compared
with those of the retriever's order and of every other order, the hint is read back from the
trace, and the listed chunks of a de-duplicated turn are counted.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from adarag import AdaRAG
from adarag.config import AdaRagConfig
from adarag.conversation import Conversation
from adarag.engine.prefill_request import PrefillRequest
from adarag.policies import POLICIES
from adarag.schema import Chunk, GenerationParams
from tests.unit.engine.helpers import CHUNKS, QUESTION

PARAMS = GenerationParams(max_new_tokens=3)
NEW = "the danube flows through vienna, budapest and belgrade to the black sea."
HINT = AdaRagConfig().experimental.arrangement.order_hint


@pytest.fixture()
def make_rag(tiny_checkpoints, tiny_config):
    def make(policy: str) -> AdaRAG:
        overrides = POLICIES[policy].overrides
        store = {"store": {"storage_dtype": "float32"}}  # hard hits are bit-exact
        cache = {**overrides["cache"], **store}
        return AdaRAG(tiny_config(tiny_checkpoints["llama"], **{**overrides, "cache": cache}))

    return make


def _hard_run(rag: AdaRAG, texts) -> int:
    """Leading chunks of ``texts`` the hard tier holds, in that order."""
    keys = rag.cache.keys([rag.prompts.chunk_ids(text) for text in texts])
    return next(
        (i for i, key in enumerate(keys.hard) if not rag.cache.store.contains(key)), len(texts)
    )


def test_the_reordered_prompt_hits_the_longest_cached_prefix(make_rag):
    rag = make_rag("ragboost")
    rag.query(QUESTION, chunks=list(CHUNKS), params=PARAMS)  # caches c0, c1, c2 as a prefix
    retrieved = [NEW, CHUNKS[1], CHUNKS[0]]
    best = max(_hard_run(rag, order) for order in itertools.permutations(retrieved))
    assert _hard_run(rag, retrieved) == 0
    answer = rag.query(QUESTION, chunks=retrieved, params=PARAMS)
    assert [c.text for c in answer.chunks] == [CHUNKS[0], CHUNKS[1], NEW]
    assert answer.trace.steps[-1].tiers == ("hard", "hard", "miss")
    assert best == 2
    # the hint names the listed numbers in the retriever's order: NEW is 3rd, c1 2nd, c0 1st
    assert answer.trace.order_hint == HINT.replace("{ranking}", "[3], [2], [1]")


def test_prefix_caching_without_reordering_misses_the_same_request(make_rag):
    rag = make_rag("prefix")
    rag.query(QUESTION, chunks=list(CHUNKS), params=PARAMS)
    answer = rag.query(QUESTION, chunks=[NEW, CHUNKS[1], CHUNKS[0]], params=PARAMS)
    assert "hard" not in answer.trace.steps[-1].tiers
    assert answer.trace.order_hint == ""


def test_the_reordered_answer_is_exactly_a_full_prefill_of_the_hinted_prompt(make_rag):
    rag = make_rag("ragboost")
    rag.query(QUESTION, chunks=list(CHUNKS), params=PARAMS)
    stream = rag.stream(QUESTION, chunks=[NEW, CHUNKS[1], CHUNKS[0]], params=PARAMS)
    reused = stream.first_token_logits.clone()
    listed = [c.text for c in stream.chunks]
    stream.answer()
    layout = rag.prompts.layout(QUESTION, listed, note=stream.trace.order_hint)
    full = rag.engine.prefill(PrefillRequest(layout))
    assert stream.trace.num_prompt_tokens == layout.num_tokens
    torch.testing.assert_close(reused, full.logits, rtol=1e-4, atol=1e-4)


def test_a_request_in_retriever_order_gets_no_hint(make_rag):
    rag = make_rag("ragboost")
    answer = rag.query(QUESTION, chunks=list(CHUNKS), params=PARAMS)
    assert answer.trace.order_hint == ""
    assert [c.text for c in answer.chunks] == list(CHUNKS)


def test_a_deduplicated_turn_lists_each_chunk_once_and_locates_the_repeated_one(make_rag):
    rag = make_rag("ragboost")
    conversation = Conversation()
    first = rag.query(QUESTION, chunks=[CHUNKS[0], CHUNKS[1]], params=PARAMS)
    conversation.add_turn(QUESTION, first.text, chunks=first.chunks)
    follow_up = "and which river runs through berlin?"
    second = rag.query(
        follow_up,
        chunks=[CHUNKS[2], CHUNKS[1]],
        params=PARAMS,
        history=conversation.history(),
        conversation_chunks=conversation.chunks,
    )
    texts = [c.text for c in second.chunks]
    assert texts == [CHUNKS[0], CHUNKS[1], CHUNKS[2]]
    assert len(texts) == len(set(texts))
    assert second.trace.steps[-1].tiers == ("hard", "hard", "miss")  # turn 1 is a hard prefix
    location = rag.config.experimental.arrangement.location_hint.replace("{position}", "2")
    assert second.trace.order_hint == HINT.replace("{ranking}", f"[3], {location}")


def test_without_deduplication_a_turn_lists_only_its_own_retrieval(make_rag):
    rag = make_rag("prefix")
    first = rag.query(QUESTION, chunks=[CHUNKS[0], CHUNKS[1]], params=PARAMS)
    second = rag.query(
        "and which river runs through berlin?",
        chunks=[CHUNKS[2], CHUNKS[1]],
        params=PARAMS,
        history=[(QUESTION, first.text)],
        conversation_chunks=first.chunks,
    )
    assert [c.text for c in second.chunks] == [CHUNKS[2], CHUNKS[1]]


def test_scheduled_requests_share_their_prefix_back_to_back(make_rag):
    rag = make_rag("ragboost")
    other = "the nile is the longest river of africa and flows into the mediterranean."
    requests = [
        [CHUNKS[2], CHUNKS[0], NEW],
        [other, "the amazon carries more water than any other river."],
        [CHUNKS[0], other, CHUNKS[2]],
        [NEW, CHUNKS[2], CHUNKS[0]],
    ]
    order = rag.schedule(requests)
    assert order == [0, 3, 2, 1]  # the three sharing c0 and c2 first, back to back
    hits = []
    for idx in order:
        answer = rag.query(QUESTION, chunks=requests[idx], params=PARAMS)
        hits.append(answer.trace.steps[-1].tiers.count("hard"))
        listed = [c.text for c in answer.chunks]
        if idx != 1:
            assert set(listed[:2]) == {CHUNKS[0], CHUNKS[2]}  # one shared order
    assert hits[:3] == [0, 3, 2]  # request 3 holds all of request 0's chunks


def test_every_tier_but_hard_is_off_and_nothing_is_approximated(make_rag):
    rag = make_rag("ragboost")
    rag.query(QUESTION, chunks=list(CHUNKS), params=PARAMS)
    answer = rag.query(QUESTION, chunks=[NEW, CHUNKS[0]], params=PARAMS)
    tiers = answer.trace.steps[-1].tiers
    assert set(tiers) <= {"hard", "miss"}
    query_tokens = len(rag.prompts.query_ids(QUESTION, (), answer.trace.order_hint))
    new_tokens = len(rag.prompts.chunk_ids(NEW))
    assert answer.trace.num_recomputed_tokens == new_tokens + query_tokens


def test_conversation_keeps_the_last_grounded_context():
    conversation = Conversation()
    conversation.add_turn("q1", "a1", chunks=(Chunk("x"), Chunk("y")))
    conversation.add_turn("q2", "no idea", chunks=())
    assert [c.text for c in conversation.chunks] == ["x", "y"]
    assert conversation.turns == [("q1", "a1")]
