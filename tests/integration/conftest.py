"""One real model and one small real Chroma knowledge base, shared by the integration tests."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest

from adarag import AdaRAG, AdaRagConfig
from adarag.retrievers import KnowledgeBase

NUM_PASSAGES = 12  # the demo corpus's first passages; the first two demo questions need 1-4
LOTHAIR_QUESTION = "When did Lothair Ii's mother die?"
FILM_QUESTION = "Which film was released first, Aas Ka Panchhi or Phoolwari?"
UNRELATED_QUESTION = "What's the weather today?"


def retrieved_titles(rag: AdaRAG, question: str, top_k: int) -> list[str]:
    """Titles of the knowledge base's top-k chunks for ``question``, best first."""
    return [chunk.metadata["title"] for chunk in rag.retrieve(question, top_k)]


def assert_used_prefix_of_retrieved(used_titles: list[str], retrieved: list[str]) -> None:
    """Adaptive augmentation conditions on a non-empty best-first prefix of the top-k."""
    assert 1 <= len(used_titles) <= len(retrieved)
    assert used_titles == retrieved[: len(used_titles)]


def config_file_with_knowledge_base(
    config: AdaRagConfig, corpus_path: Path, tokenizer: object, directory: Path
) -> Path:
    """Ingest the corpus into ``config``'s knowledge base; the config saved for ``--config``.

    For CLI subprocesses, which need a knowledge base of their own (the test process holds the
    shared one's Chroma directory).
    """
    with KnowledgeBase(config.retrieval) as kb:
        kb.ingest([corpus_path], tokenizer=tokenizer)
    path = directory / "config.json"
    path.write_text(json.dumps(config.model_dump(mode="json")))
    return path


@pytest.fixture(scope="session")
def kb_config(real_config, tmp_path_factory) -> AdaRagConfig:
    """The real model, with a Chroma directory of its own."""
    directory = tmp_path_factory.mktemp("chroma")
    return AdaRagConfig.build(
        real_config,
        retrieval={"chroma_directory": str(directory), "collection": "tests", "top_k": 3},
    )


@pytest.fixture(scope="session")
def corpus_path(tmp_path_factory):
    lines = resources.files("adarag.data").joinpath("demo_corpus.jsonl").read_text().splitlines()
    path = tmp_path_factory.mktemp("corpus") / "passages.jsonl"
    path.write_text("\n".join(lines[:NUM_PASSAGES]) + "\n")
    assert all(json.loads(line)["text"] for line in lines[:NUM_PASSAGES])
    return path


@pytest.fixture(scope="session")
def knowledge_base(kb_config, corpus_path, shared_rag):
    with KnowledgeBase(kb_config.retrieval) as kb:
        kb.ingest([corpus_path], tokenizer=shared_rag.tokenizer)
        yield kb


@pytest.fixture(scope="session")
def shared_rag(kb_config) -> AdaRAG:
    """The one pipeline (and model) the integration tests share."""
    rag = AdaRAG(kb_config)
    _ = rag.engine
    return rag


@pytest.fixture(scope="session")
def kb_rag(shared_rag, knowledge_base) -> AdaRAG:
    """The shared pipeline answering from the knowledge base."""
    shared_rag.retriever = knowledge_base
    return shared_rag
