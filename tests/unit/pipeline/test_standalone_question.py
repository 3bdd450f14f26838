"""A follow-up's retrieval text: the earlier turns joined to it, or the condensed question."""

from __future__ import annotations

import pytest

from adarag import AdaRAG, Chunk, MemoryRetriever
from adarag.config import CONDENSE_PROMPT
from adarag.errors import ConfigError
from adarag.pipeline import retrieval_query
from adarag.pipeline.prompt import condense_prompt
from adarag.schema import GenerationParams
from tests.unit.engine.helpers import CHUNKS

HISTORY = [("who was the queen?", "ermengarde")]


@pytest.fixture()
def make_rag(tiny_checkpoints, tiny_config):
    def make(**overrides):
        config = tiny_config(tiny_checkpoints["llama"], augment={"enabled": False}, **overrides)
        return AdaRAG(config, retriever=MemoryRetriever([Chunk(text) for text in CHUNKS]))

    return make


def test_concatenation_is_the_questions_in_order(make_rag):
    rag = make_rag(chat={"standalone_question": "concatenate"})
    assert rag.standalone_question("when did she die?", HISTORY) == retrieval_query(
        "when did she die?", HISTORY
    )
    assert rag.standalone_question("when did she die?") == "when did she die?"


def test_by_default_a_follow_up_is_retrieved_with_the_earlier_answers(make_rag):
    """Regression: only the earlier questions joined the follow-up, never the answers."""
    history = [("Who is the founder we talked about?", "Marta Kowalski.")]
    passages = [
        Chunk("Marta Kowalski was born in Gdansk in 1961 and founded the Vistula press."),
        Chunk("The founder of a company is the person who starts it; founders talk a lot."),
        Chunk("Where a person was born is recorded on the birth certificate."),
    ]
    rag = make_rag()
    assert rag.config.chat.standalone_question == "turns"
    query = rag.standalone_question("Where was she born?", history)
    assert query == retrieval_query("Where was she born?", history, with_answers=True)
    assert "Marta Kowalski." in query and query.index("Where was she born?") < query.index("Marta")
    rag.retriever = RecordingRetriever(passages)
    answer = rag.query(
        "Where was she born?", history=history, params=GenerationParams(max_new_tokens=1)
    )
    assert rag.retriever.queries == [query]
    assert answer.chunks[0].text == passages[0].text  # found by the name the answer gave
    questions_only = make_rag(chat={"standalone_question": "concatenate"})
    assert "Marta" not in questions_only.standalone_question("Where was she born?", history)


class RecordingRetriever(MemoryRetriever):
    def __init__(self, chunks):
        super().__init__(chunks)
        self.queries = []

    def retrieve(self, query, top_k):
        self.queries.append(query)
        return super().retrieve(query, top_k)


def test_condensing_asks_the_model_with_the_turns_and_retrieves_with_its_rewrite(make_rag):
    rag = make_rag(chat={"standalone_question": "condense", "max_condense_tokens": 6})
    prompt = condense_prompt(CONDENSE_PROMPT, "when did she die?", HISTORY)
    assert "Human: who was the queen?\nAssistant: ermengarde" in prompt
    assert prompt.index("ermengarde") < prompt.index("when did she die?")
    params = GenerationParams(max_new_tokens=6)
    rewrite = rag.generate([{"role": "user", "content": prompt}], params=params).answer().text
    lines = [line.strip() for line in rewrite.splitlines() if line.strip()]
    expected = lines[0] if lines else retrieval_query("when did she die?", HISTORY)
    assert rag.standalone_question("when did she die?", HISTORY) == expected
    rag.retriever = RecordingRetriever([Chunk(text) for text in CHUNKS])
    rag.query("when did she die?", history=HISTORY, params=GenerationParams(max_new_tokens=2))
    assert rag.retriever.queries == [expected]


def test_a_condense_prompt_without_its_fields_is_refused():
    with pytest.raises(ConfigError, match="chat_history"):
        AdaRAG(chat={"condense_prompt": "Rewrite: {question}"})
