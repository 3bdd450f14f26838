"""A request's instruction (a chat's system message): applied after the cached context.

The instruction goes right before the question, in the query suffix, so the system prefix and
the chunks keep their cache keys: an answer with one reuses the KV a plain request cached, and
equals a full prefill of the prompt that holds it.
"""

from __future__ import annotations

import pytest
import torch

from adarag import AdaRAG
from adarag.engine.prefill_request import PrefillRequest
from adarag.errors import InputError
from adarag.pipeline import Request
from adarag.policies import POLICIES
from adarag.schema import GenerationParams
from tests.unit.engine.helpers import CHUNKS, QUESTION

PARAMS = GenerationParams(max_new_tokens=3)
INSTRUCTION = "Always answer in French."


@pytest.fixture()
def rag(tiny_checkpoints, tiny_config) -> AdaRAG:
    overrides = POLICIES["ragboost"].overrides  # hard hits: reused KV is exact
    cache = {**overrides["cache"], "store": {"storage_dtype": "float32"}}
    return AdaRAG(tiny_config(tiny_checkpoints["llama"], **{**overrides, "cache": cache}))


def test_an_instruction_reuses_the_cached_context_and_equals_a_full_prefill(rag):
    plain = rag.query(QUESTION, chunks=list(CHUNKS), params=PARAMS)
    request = Request.of(QUESTION, chunks=CHUNKS, params=PARAMS, instruction=INSTRUCTION)
    stream = rag.stream_request(request)
    reused = stream.first_token_logits.clone()
    stream.answer()
    assert stream.trace.steps[-1].tiers == ("hard", "hard", "hard")  # the context's KV reused
    layout = rag.prompts.layout(QUESTION, list(CHUNKS), note=f"{INSTRUCTION}\n")
    assert layout.system_ids == rag.prompts.system_ids  # the system prefix is unchanged
    assert stream.trace.num_prompt_tokens == layout.num_tokens > plain.trace.num_prompt_tokens
    assert stream.trace.order_hint == ""  # the trace's hint stays the arrangement's
    full = rag.engine.prefill(PrefillRequest(layout))
    torch.testing.assert_close(reused, full.logits, rtol=1e-4, atol=1e-4)


def test_an_instruction_the_prompt_cannot_hold_is_refused():
    with pytest.raises(InputError, match="instruction"):
        Request.of(QUESTION, instruction="answer \ud800 in French")
    with pytest.raises(InputError, match="U\\+0002"):
        Request.of(QUESTION, instruction="answer\x02 in French")
