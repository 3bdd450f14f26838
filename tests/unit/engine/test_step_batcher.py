"""engine.batch_decode: concurrent requests' decoding steps run as one batch."""

from __future__ import annotations

import threading

import pytest

from adarag.engine.prefill_request import PrefillRequest
from adarag.schema import GenerationParams
from tests.unit.engine.helpers import CHUNKS, QUESTION, layout_of, load_engine

QUESTIONS = [
    QUESTION,
    "Which city is the capital of Germany?",
    "What does the fox jump over?",
    "Name the capital of France.",
]


@pytest.mark.parametrize("family", ["llama", "llama-hd32"])
def test_concurrent_requests_decode_together_and_get_their_own_tokens(
    family, tiny_checkpoints, tiny_config
):
    lone = load_engine(tiny_config(tiny_checkpoints[family]))
    batched = load_engine(tiny_config(tiny_checkpoints[family], engine={"batch_decode": True}))
    assert lone.decoder.batcher is None and batched.decoder.batcher is not None
    params = GenerationParams(max_new_tokens=16)
    layouts = [layout_of(lone, q, CHUNKS[: i % 3 + 1]) for i, q in enumerate(QUESTIONS)]
    expected = [
        list(
            lone.decode_tokens(
                layout, lone.prefill(PrefillRequest(layout, max_new_tokens=16)), params
            )
        )
        for layout in layouts
    ]
    outputs = [batched.prefill(PrefillRequest(layout, max_new_tokens=16)) for layout in layouts]
    got: list[list[int] | None] = [None] * len(layouts)
    start = threading.Barrier(len(layouts))

    def decode(index: int) -> None:
        start.wait()
        got[index] = list(batched.decode_tokens(layouts[index], outputs[index], params))

    threads = [threading.Thread(target=decode, args=(i,)) for i in range(len(layouts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert got == expected
    sizes = batched.decoder.batcher.batch_sizes
    assert max(sizes) > 1, f"steps never batched: {sizes}"
    assert sum(sizes) == sum(max(len(tokens) - 1, 0) for tokens in expected)


def test_a_cancelled_request_leaves_the_batch(tiny_checkpoints, tiny_config):
    engine = load_engine(tiny_config(tiny_checkpoints["llama"], engine={"batch_decode": True}))
    layout = layout_of(engine, QUESTION, CHUNKS)
    params = GenerationParams(max_new_tokens=8)
    stream = engine.decode_tokens(
        layout, engine.prefill(PrefillRequest(layout, max_new_tokens=8)), params
    )
    next(stream)
    assert engine.decoder.batcher._decoding == 1
    stream.close()  # a client that went away
    assert engine.decoder.batcher._decoding == 0
    # a lone request afterwards steps alone, without waiting for the one that left
    tokens = list(
        engine.decode_tokens(
            layout, engine.prefill(PrefillRequest(layout, max_new_tokens=8)), params
        )
    )
    assert tokens and engine.decoder.batcher.batch_sizes[-1] == 1


def test_pipeline_streams_of_concurrent_requests_are_batched(tiny_checkpoints, tiny_config):
    # through AdaRAG: each thread streams its own answer; the steps meet in the batcher (the
    # pipeline takes no engine lock for them) and every answer equals the lone pipeline's
    from adarag import AdaRAG, Chunk

    chunks = [Chunk(text) for text in CHUNKS]
    params = GenerationParams(max_new_tokens=12)
    lone = AdaRAG(tiny_config(tiny_checkpoints["llama-hd32"]))
    expected = [lone.query(q, chunks=chunks, params=params).text for q in QUESTIONS]
    rag = AdaRAG(tiny_config(tiny_checkpoints["llama-hd32"], engine={"batch_decode": True}))
    rag.query(QUESTIONS[0], chunks=chunks, params=params)  # warm the chunks' KV once
    got: list[str | None] = [None] * len(QUESTIONS)
    start = threading.Barrier(len(QUESTIONS))

    def ask(index: int) -> None:
        start.wait()
        got[index] = "".join(rag.stream(QUESTIONS[index], chunks=chunks, params=params))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(QUESTIONS))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert [text.strip() for text in got] == [text.strip() for text in expected]
    assert max(rag.engine.decoder.batcher.batch_sizes) > 1
