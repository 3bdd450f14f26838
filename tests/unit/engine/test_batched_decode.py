"""Decoding several prefilled prompts in one batch gives each the tokens it gets alone."""

from __future__ import annotations

import pytest
import torch

from adarag.engine.prefill_request import PrefillRequest
from adarag.schema import GenerationParams
from tests.unit.engine.helpers import CHUNKS, QUESTION, layout_of, load_engine

QUESTIONS = [QUESTION, "Which city is the capital of Germany?", "What does the fox jump over?"]


@pytest.mark.parametrize("family", ["llama", "qwen2", "llama-hd32"])
def test_batched_decode_matches_each_sequence_alone(family, tiny_checkpoints, tiny_config):
    engine = load_engine(tiny_config(tiny_checkpoints[family]))
    decoder = engine.decoder
    # prompts of different lengths, so the sequences sit at different positions
    layouts = [
        layout_of(engine, question, CHUNKS[: index + 1]) for index, question in enumerate(QUESTIONS)
    ]
    assert len({layout.num_tokens for layout in layouts}) == len(layouts)
    params = GenerationParams(max_new_tokens=12)
    alone = [
        list(
            engine.decode_tokens(
                layout, engine.prefill(PrefillRequest(layout, max_new_tokens=12)), params
            )
        )
        for layout in layouts
    ]
    outputs = [engine.prefill(PrefillRequest(layout, max_new_tokens=12)) for layout in layouts]
    batched = decoder.decode_batch(layouts, outputs, params)
    assert batched == alone
    assert any(len(tokens) > 1 for tokens in batched)
    # the batched step's logits are each sequence's own step, up to float32 rounding
    kvs = [output.kv for output in outputs]
    for layout, kv in zip(layouts, kvs, strict=True):
        kv.length = layout.num_tokens
    first = [tokens[0] for tokens in batched]
    together = engine.runner.decode_batch(first, kvs)
    for row, (layout, kv) in enumerate(zip(layouts, kvs, strict=True)):
        kv.length = layout.num_tokens
        single = engine.runner.decode(first[row], kv)
        torch.testing.assert_close(together[row], single, atol=1e-4, rtol=1e-4)


def test_a_sequence_that_ends_leaves_the_batch(tiny_checkpoints, tiny_config):
    engine = load_engine(tiny_config(tiny_checkpoints["llama"]))
    layouts = [layout_of(engine, question, CHUNKS[:2]) for question in QUESTIONS[:2]]
    # the first prefill reserves room for 2 new rows, the second for 10: the first sequence runs
    # out of room after 3 tokens and leaves; the second decodes on alone
    outputs = [
        engine.prefill(PrefillRequest(layouts[0], max_new_tokens=2)),
        engine.prefill(PrefillRequest(layouts[1], max_new_tokens=10)),
    ]
    params = GenerationParams(max_new_tokens=10)
    alone = [
        list(engine.decode_tokens(layout, output, params))
        for layout, output in zip(layouts, outputs, strict=True)
    ]
    batched = engine.decoder.decode_batch(layouts, outputs, params)
    assert batched == alone
    assert len(batched[0]) < len(batched[1])
