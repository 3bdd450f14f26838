"""Citation mode: numbered passages in the prompt, numbered sources, chunk KV reused as is."""

from __future__ import annotations

import pytest

from adarag import AdaRAG
from adarag.config import PromptConfig
from adarag.errors import ConfigError
from adarag.pipeline import CITATION_KEY, cited_numbers
from adarag.schema import GenerationParams
from tests.unit.engine.helpers import CHUNKS, QUESTION

PARAMS = GenerationParams(max_new_tokens=4)


@pytest.fixture()
def make_rag(tiny_checkpoints, tiny_config):
    def make(**overrides):
        return AdaRAG(
            tiny_config(tiny_checkpoints["llama"], augment={"enabled": False}, **overrides)
        )

    return make


def test_passages_are_numbered_outside_the_chunks_whose_warmed_kv_is_reused(make_rag):
    rag = make_rag(prompt={"citations": True})
    plain = make_rag().prompts.layout(QUESTION, CHUNKS)
    layout = rag.prompts.layout(QUESTION, CHUNKS)
    assert layout.chunk_ids == plain.chunk_ids and layout.system_ids == plain.system_ids
    labels = [rag.tokenizer.decode(ids) for ids in layout.chunk_labels]
    assert labels == ["[1] ", "[2] ", "[3] "]
    context = rag.prompts.messages(QUESTION, CHUNKS)[1]["content"]
    for number, chunk in enumerate(CHUNKS, start=1):
        assert f"[{number}] {chunk}" in context
    assert PromptConfig().citation_instruction in rag.tokenizer.decode(layout.query_ids)
    rag.warm(CHUNKS)  # independent KV computed without any label
    answer = rag.query(QUESTION, chunks=list(CHUNKS), params=PARAMS)
    assert answer.trace.steps[0].tiers == ("independent",) * len(CHUNKS)
    assert answer.trace.num_prompt_tokens == layout.num_tokens
    numbers = [chunk.metadata[CITATION_KEY] for chunk in answer.chunks]
    assert numbers == [1, 2, 3]
    assert set(cited_numbers(answer.text)) <= set(numbers)
    again = rag.query(QUESTION, chunks=list(CHUNKS), params=PARAMS)
    assert again.trace.steps[0].tiers == ("hard",) * len(CHUNKS)


def test_cited_numbers_are_read_in_order_of_first_citation():
    assert cited_numbers("Paris [2], on the Seine [1][2]; see [x] and [ 3 ].") == [2, 1]


def test_a_label_without_its_number_is_refused():
    with pytest.raises(ConfigError, match="citation_label"):
        AdaRAG(prompt={"citation_label": "Passage: "})
