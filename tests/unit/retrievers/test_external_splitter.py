"""A LlamaIndex or LangChain splitter cuts ingest's chunks; heading paths and ids stay."""

from __future__ import annotations

import uuid

import pytest

chromadb = pytest.importorskip("chromadb")

from adarag.config import RetrievalConfig  # noqa: E402
from adarag.errors import ConfigError  # noqa: E402
from adarag.retrievers import KnowledgeBase  # noqa: E402
from adarag.retrievers.splitting import markdown_sections  # noqa: E402
from tests.unit.retrievers.test_knowledge_base import WordEmbedder, WordTokenizer  # noqa: E402

SECTIONS = {
    "Install": "Run the installer. It asks for a folder. " * 6,
    "Use": "Open the app. Pick a file. Press start. " * 6,
    "Remove": "Delete the folder. Nothing else is kept. " * 6,
}


def llama_index_splitter():
    splitters = pytest.importorskip("llama_index.core.node_parser")
    return splitters.SentenceSplitter(chunk_size=40, chunk_overlap=0)


def langchain_splitter():
    splitters = pytest.importorskip("langchain_text_splitters")
    return splitters.RecursiveCharacterTextSplitter(chunk_size=120, chunk_overlap=0)


def paragraph_splitter(text: str) -> list[str]:
    return text.split(". ")


SPLITTERS = {
    "llama_index": llama_index_splitter,
    "langchain": langchain_splitter,
    "function": lambda: paragraph_splitter,
}


def write_guide(path, sections: dict[str, str]):
    path.write_text("".join(f"## {heading}\n{body}\n\n" for heading, body in sections.items()))
    return path


def make_kb(splitter):
    config = RetrievalConfig(collection=f"split-{uuid.uuid4().hex[:8]}")
    return KnowledgeBase(
        config, client=chromadb.EphemeralClient(), embedder=WordEmbedder(), splitter=splitter
    )


@pytest.mark.parametrize("kind", list(SPLITTERS))
def test_the_splitter_cuts_each_section_and_the_heading_paths_stay(kind, tmp_path):
    splitter = SPLITTERS[kind]()
    kb = make_kb(splitter)
    try:
        guide = write_guide(tmp_path / "guide.md", SECTIONS)
        kb.ingest([guide], tokenizer=WordTokenizer())
        stored = sorted(kb.chunks(), key=lambda chunk: chunk.metadata["chunk_idx"])
        cut = kb.splitter.split
        expected = [
            (section.heading, piece)
            for section in markdown_sections(guide.read_text())
            for piece in cut(section.text)
        ]
        assert len(expected) > len(SECTIONS)  # the splitter cut inside sections
        assert [(c.metadata["heading"], c.text) for c in stored] == expected
        assert {c.metadata["splitter"] for c in stored} == {kb.splitter_name}
    finally:
        kb.collection._client.delete_collection(kb.config.collection)


@pytest.mark.parametrize("kind", list(SPLITTERS))
def test_unchanged_sections_keep_their_chunk_ids_across_a_reingest(kind, tmp_path):
    kb = make_kb(SPLITTERS[kind]())
    try:
        guide = write_guide(tmp_path / "guide.md", SECTIONS)
        kb.ingest([guide], tokenizer=WordTokenizer())
        before = {c.chunk_id: c.metadata["heading"] for c in kb.chunks()}
        write_guide(guide, {**SECTIONS, "Use": "Open the app and follow the wizard."})
        report = kb.ingest([guide], tokenizer=WordTokenizer())
        after = {c.chunk_id: c.metadata["heading"] for c in kb.chunks()}
        kept = {chunk_id for chunk_id, heading in before.items() if heading != "Use"}
        assert kept <= set(after)  # every chunk of the untouched sections, same id
        assert report.num_chunks_kept == len(kept)
        assert [c.metadata["heading"] for c in report.added] == ["Use"]
        assert all(after[chunk_id] == "Use" for chunk_id in set(after) - kept)
    finally:
        kb.collection._client.delete_collection(kb.config.collection)


def test_a_file_split_by_another_splitter_is_split_again(tmp_path):
    client = chromadb.EphemeralClient()
    config = RetrievalConfig(collection=f"split-{uuid.uuid4().hex[:8]}")
    guide = write_guide(tmp_path / "guide.md", SECTIONS)
    built_in = KnowledgeBase(config, client=client, embedder=WordEmbedder())
    built_in.ingest([guide], tokenizer=WordTokenizer())
    external = KnowledgeBase(
        config, client=client, embedder=WordEmbedder(), splitter=paragraph_splitter
    )
    report = external.ingest([guide], tokenizer=WordTokenizer())
    assert report.num_files_unchanged == 0 and report.added
    assert {c.metadata["splitter"] for c in external.chunks()} == {external.splitter_name}
    assert external.ingest([guide], tokenizer=WordTokenizer()).num_files_unchanged == 1
    client.delete_collection(config.collection)


def test_a_splitter_records_its_class_and_sizes_and_anything_else_is_refused():
    kb = make_kb(langchain_splitter())
    try:
        assert kb.splitter_name == (
            "langchain_text_splitters.character.RecursiveCharacterTextSplitter"
            "(chunk_size=120, chunk_overlap=0)"
        )
    finally:
        kb.collection._client.delete_collection(kb.config.collection)
    with pytest.raises(ConfigError, match="a splitter must be a LlamaIndex NodeParser"):
        make_kb(42)
