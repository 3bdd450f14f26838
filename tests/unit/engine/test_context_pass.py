"""The query over several cached contexts in one pass equals a full prefill of each prompt."""

from __future__ import annotations

import pytest
import torch

from adarag.engine.prefill_request import PrefillRequest
from adarag.errors import InputError
from adarag.evaluation.reuse import independent_chunks
from adarag.schema import GenerationParams
from tests.unit.engine.helpers import CHUNKS, QUESTION, layout_of, load_engine


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_each_context_gives_the_full_prefill_of_its_own_prompt(
    family, tiny_checkpoints, tiny_config
):
    engine = load_engine(tiny_config(tiny_checkpoints[family], engine={"dtype": "float32"}))
    layout = layout_of(engine, QUESTION, CHUNKS)
    system_kv, chunk_kvs = independent_chunks(engine, layout)
    contexts = [[system_kv], *([system_kv, kv] for kv in chunk_kvs)]
    passed = engine.query_over_contexts(layout.query_ids, contexts, reserve_rows=8)
    # chunks of different lengths: the query stands at different positions in each context
    assert len({kv.num_tokens for kv in chunk_kvs}) > 1
    prompts = [layout.with_chunks(0), *(_alone(layout, idx) for idx in range(len(chunk_kvs)))]
    for row, prompt in enumerate(prompts):
        full = engine.prefill(PrefillRequest(prompt, max_new_tokens=8))
        torch.testing.assert_close(passed.logits[row], full.logits.float(), atol=2e-4, rtol=2e-4)
    # the contexts really differ: a pass that ignored them would give one row N + 1 times
    assert not torch.allclose(passed.logits[0], passed.logits[1], atol=1e-3)
    params = GenerationParams(max_new_tokens=8)
    answers = engine.greedy_answers(passed, 8)
    for row, prompt in enumerate(prompts):
        full = engine.prefill(PrefillRequest(prompt, max_new_tokens=8))
        assert answers[row] == list(engine.decode_tokens(prompt, full, params))


def _alone(layout, idx):
    """``layout`` with only its chunk ``idx``."""
    import dataclasses

    return dataclasses.replace(layout, chunk_ids=(layout.chunk_ids[idx],))


def test_no_query_or_no_context_is_refused(tiny_checkpoints, tiny_config):
    engine = load_engine(tiny_config(tiny_checkpoints["llama"]))
    layout = layout_of(engine, QUESTION, CHUNKS[:1])
    system_kv, _ = independent_chunks(engine, layout)
    with pytest.raises(InputError, match="no tokens"):
        engine.query_over_contexts((), [[system_kv]])
    with pytest.raises(InputError, match="no contexts"):
        engine.query_over_contexts(layout.query_ids, [])
