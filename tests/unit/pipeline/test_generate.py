"""AdaRAG.generate (plain prompts for the LLM adapters) and with_config (shared model and lock)."""

from __future__ import annotations

import pytest

from adarag import AdaRAG, Chunk, GenerationParams
from adarag.errors import InputError


@pytest.fixture()
def rag(tiny_checkpoints, tiny_config):
    return AdaRAG(tiny_config(tiny_checkpoints["llama"]))


def test_generate_from_chat_messages_streams_and_counts_tokens(rag):
    stream = rag.generate(
        [{"role": "user", "content": "the quick brown fox"}],
        params=GenerationParams(max_new_tokens=5),
    )
    assert stream.chunks == () and stream.trace.num_prompt_tokens > 0
    answer = stream.answer()
    assert 0 < answer.num_completion_tokens <= 5
    assert answer.trace.steps[0].tiers == ()


def test_generate_rejects_an_empty_prompt_or_message(rag):
    with pytest.raises(InputError, match="prompt is empty"):
        rag.generate("  ")
    with pytest.raises(InputError, match="'role' and 'content'"):
        rag.generate([{"role": "user"}])


def test_with_config_shares_model_and_lock_and_applies_the_prompt(rag):
    terse = rag.with_config(prompt={"context_intro": "Facts:\n"})
    assert terse.engine is rag.engine and terse.engine_lock is rag.engine_lock
    assert terse.prompts is not rag.prompts
    assert terse.prompts.system_ids != rag.prompts.system_ids
    answer = terse.query("the fox?", chunks=[Chunk("the quick brown fox")])
    assert answer.trace.num_prompt_tokens == len(
        terse.prompts.layout("the fox?", ["the quick brown fox"]).token_ids
    )
