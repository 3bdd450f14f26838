"""Knowledge-base bookkeeping on an in-memory Chroma with exact, hash-based embeddings."""

from __future__ import annotations

import hashlib
import math
import uuid

import pytest

chromadb = pytest.importorskip("chromadb")

from adarag.config import RetrievalConfig  # noqa: E402
from adarag.errors import ConfigError, KnowledgeBaseError  # noqa: E402
from adarag.retrievers import KnowledgeBase  # noqa: E402
from adarag.schema import Chunk  # noqa: E402


class WordEmbedder:
    """Deterministic bag-of-words vectors: texts sharing words are close."""

    name = "word-hash-16"
    dimension = 16

    def embed_documents(self, texts):
        return [self.embed_query(text) for text in texts]

    def embed_query(self, text):
        vector = [0.0] * self.dimension
        for word in text.lower().split():
            vector[hashlib.sha256(word.encode()).digest()[0] % self.dimension] += 1.0
        norm = math.sqrt(sum(x * x for x in vector)) or 1.0
        return [x / norm for x in vector]


class WordTokenizer:
    """Whitespace 'tokens' with offsets, shaped like a Hugging Face fast tokenizer's output."""

    def __call__(self, text, add_special_tokens=False, return_offsets_mapping=True):
        import re

        return {"offset_mapping": [m.span() for m in re.finditer(r"\S+", text)]}


@pytest.fixture()
def kb():
    config = RetrievalConfig(
        collection=f"kb-{uuid.uuid4().hex[:8]}", chunk_tokens=16, chunk_overlap_tokens=4
    )
    base = KnowledgeBase(config, client=chromadb.EphemeralClient(), embedder=WordEmbedder())
    yield base
    base.collection._client.delete_collection(config.collection)


def _write(path, words):
    path.write_text(" ".join(words))
    return path


def test_reingesting_an_unchanged_file_does_no_work(kb, tmp_path):
    doc = _write(tmp_path / "doc.md", [f"w{i}" for i in range(40)])
    first = kb.ingest([doc], tokenizer=WordTokenizer())
    assert len(first.added) == 3 and kb.count() == 3  # windows at words 0, 12 and 24
    second = kb.ingest([doc], tokenizer=WordTokenizer())
    assert second.added == () and second.num_files_unchanged == 1 and kb.count() == 3


def test_changed_file_keeps_unchanged_chunks_and_drops_stale_ones(kb, tmp_path):
    doc = _write(tmp_path / "doc.md", [f"w{i}" for i in range(40)])
    kb.ingest([doc], tokenizer=WordTokenizer())
    _write(doc, [f"w{i}" for i in range(24)] + ["changed"] * 16)
    report = kb.ingest([doc], tokenizer=WordTokenizer())
    assert report.num_chunks_kept == 1 and report.num_chunks_removed == 2
    assert len(report.added) == 2 and kb.count() == 3
    assert kb.ingest([doc], tokenizer=WordTokenizer()).num_files_unchanged == 1


def test_an_ingest_stopped_before_removing_stale_chunks_is_completed_by_the_next(
    kb, tmp_path, monkeypatch
):
    doc = _write(tmp_path / "doc.md", [f"w{i}" for i in range(40)])
    kb.ingest([doc], tokenizer=WordTokenizer())
    _write(doc, [f"w{i}" for i in range(24)] + ["changed"] * 16)

    def crash(**_: object) -> None:
        raise KeyboardInterrupt  # stopped after the new chunks were added

    with monkeypatch.context() as patch:
        patch.setattr(kb.collection, "delete", crash)
        with pytest.raises(KeyboardInterrupt):
            kb.ingest([doc], tokenizer=WordTokenizer())
    assert kb.count() == 5  # new chunks added, stale ones still there
    report = kb.ingest([doc], tokenizer=WordTokenizer())
    assert report.num_files_unchanged == 0 and report.num_chunks_removed == 2
    assert kb.count() == 3
    assert {c.metadata["file_num_chunks"] for c in kb.chunks()} == {3}


def test_failed_ingest_loses_nothing(kb, tmp_path):
    doc = _write(tmp_path / "doc.md", ["alpha"] * 10)
    kb.ingest([doc], tokenizer=WordTokenizer())
    with pytest.raises(Exception, match="does not exist"):
        kb.ingest([doc, tmp_path / "missing.md"], tokenizer=WordTokenizer())
    assert kb.count() == 1


def test_retrieval_scores_are_cosine_similarities_best_first(kb, tmp_path):
    kb.add_chunks([])
    from adarag.schema import Chunk

    kb.add_chunks([Chunk("red apples grow"), Chunk("blue sea waves"), Chunk("red apples fall")])
    found = kb.retrieve("red apples", 2)
    assert [c.text for c in found][0].startswith("red apples")
    assert found[0].score >= found[1].score
    assert found[0].metadata["space"] == "cosine"
    assert abs(found[0].score - (1 - found[0].metadata["distance"])) < 1e-6


def test_empty_knowledge_base_says_so(kb):
    with pytest.raises(KnowledgeBaseError, match="is empty"):
        kb.retrieve("anything", 3)


def test_collection_of_another_dimension_is_refused_untouched():
    client = chromadb.EphemeralClient()
    name = f"dims-{uuid.uuid4().hex[:8]}"
    other = client.create_collection(name, embedding_function=None)
    other.add(ids=["a"], embeddings=[[1.0] * 8], documents=["eight dims"])
    with pytest.raises(KnowledgeBaseError, match="8-dimensional"):
        KnowledgeBase(RetrievalConfig(collection=name), client=client, embedder=WordEmbedder())
    assert client.get_collection(name).count() == 1
    client.delete_collection(name)


def test_a_reader_never_creates_a_collection_and_names_the_ones_there_are(tmp_path):
    client = chromadb.PersistentClient(path=str(tmp_path / "chroma"))
    held = RetrievalConfig(collection="notes")
    KnowledgeBase(held, client=client, embedder=WordEmbedder())
    typo = RetrievalConfig(collection="ntoes")
    with pytest.raises(KnowledgeBaseError, match=r"no collection 'ntoes' \(collections: 'notes'\)"):
        KnowledgeBase(typo, client=client, embedder=WordEmbedder(), create=False)
    assert [c.name for c in client.list_collections()] == ["notes"]
    reader = KnowledgeBase(held, client=client, embedder=WordEmbedder(), create=False)
    assert reader.count() == 0


def test_prune_removes_the_chunks_of_deleted_files_only(kb, tmp_path):
    kept = _write(tmp_path / "kept.md", [f"k{i}" for i in range(40)])
    deleted = _write(tmp_path / "deleted.md", [f"d{i}" for i in range(40)])
    kb.ingest([kept, deleted], tokenizer=WordTokenizer())
    kb.add_chunks([Chunk("a passage added as text, not from a file")])
    before = kb.count()
    num_deleted = len(kb.collection.get(where={"source": str(deleted)}, include=[])["ids"])
    assert num_deleted > 0
    deleted.unlink()
    assert kb.prune_missing_sources() == {str(deleted): num_deleted}
    assert kb.count() == before - num_deleted
    assert all(c.metadata.get("source") != str(deleted) for c in kb.retrieve("d0 d1 d2 d3", 3))
    assert any(c.metadata.get("source") == "memory" for c in kb.chunks())
    assert kb.prune_missing_sources() == {}  # nothing more to prune


def _chroma_function(function_name, dimension):
    """A Chroma embedding function that records ``function_name`` in the collection config."""
    from chromadb.utils.embedding_functions import register_embedding_function

    class Recorded(chromadb.EmbeddingFunction):
        def __init__(self, dim=dimension):
            self.dim = dim

        def __call__(self, input):
            return [WordEmbedder().embed_query(text)[: self.dim] for text in input]

        @staticmethod
        def name():
            return function_name

        def get_config(self):
            return {"dim": self.dim}

        @staticmethod
        def build_from_config(config):
            return Recorded(config["dim"])

    register_embedding_function(Recorded)
    return Recorded()


def test_a_same_dimension_collection_of_another_chroma_embedding_function_is_refused(tmp_path):
    client = chromadb.PersistentClient(path=str(tmp_path / "chroma"))
    foreign = client.create_collection("foreign", embedding_function=_chroma_function("other", 16))
    foreign.add(ids=["a"], documents=["text embedded by another model"])
    config = RetrievalConfig(collection="foreign")
    with pytest.raises(KnowledgeBaseError, match=r"Chroma's 'other' embedding function"):
        KnowledgeBase(config, client=client, embedder=WordEmbedder())
    assert foreign.count() == 1  # nothing was changed
    # the same model under its own name is accepted
    own = client.create_collection(
        "own", embedding_function=_chroma_function(WordEmbedder.name, 16)
    )
    own.add(ids=["a"], documents=["text embedded by the same model"])
    reader = KnowledgeBase(
        RetrievalConfig(collection="own"), client=client, embedder=WordEmbedder()
    )
    assert reader.count() == 1


def test_a_metadata_filter_restricts_retrieval_to_matching_chunks(tmp_path):
    client = chromadb.EphemeralClient()
    config = RetrievalConfig(
        collection=f"kb-{uuid.uuid4().hex[:8]}", chunk_tokens=16, chunk_overlap_tokens=4
    )
    a = _write(tmp_path / "a.md", [f"shared{i}" for i in range(16)])
    b = _write(tmp_path / "b.md", [f"shared{i}" for i in range(16)] + ["extra"])
    KnowledgeBase(config, client=client, embedder=WordEmbedder()).ingest(
        [a, b], tokenizer=WordTokenizer()
    )
    only_b = config.model_copy(update={"where": {"source": str(b)}})
    kb = KnowledgeBase(only_b, client=client, embedder=WordEmbedder())
    found = kb.retrieve("shared0 shared1", 4)
    assert found and {c.metadata["source"] for c in found} == {str(b)}
    both = config.model_copy(update={"where": {"source": str(a), "chunk_idx": 0}})
    found = KnowledgeBase(both, client=client, embedder=WordEmbedder()).retrieve("shared0", 4)
    assert [(c.metadata["source"], c.metadata["chunk_idx"]) for c in found] == [(str(a), 0)]


def test_a_chromadb_embedding_function_can_be_the_embedder(tmp_path):
    client = chromadb.PersistentClient(path=str(tmp_path / "chroma"))
    function = _chroma_function("word-hash-fn", 16)
    theirs = client.create_collection("theirs", embedding_function=function)
    theirs.add(ids=["r", "b"], documents=["the river flows", "glass bells ring"])
    kb = KnowledgeBase(RetrievalConfig(collection="theirs"), client=client, embedder=function)
    assert kb.embedder.name == "word-hash-fn" and kb.embedder.dimension == 16
    assert [c.chunk_id for c in kb.retrieve("river flows", 1)] == ["r"]
    with pytest.raises(ConfigError, match="chromadb EmbeddingFunction"):
        KnowledgeBase(RetrievalConfig(collection="theirs"), client=client, embedder=42)


@pytest.mark.parametrize(
    "text", ["", "   ", "bad \ud800 text"], ids=["empty", "blank", "surrogate"]
)
def test_chunks_with_bad_text_are_refused_and_nothing_is_stored(kb, text):
    from adarag.errors import InputError
    from adarag.schema import Chunk

    kb.add_chunks([Chunk("a good chunk")])
    with pytest.raises(InputError, match="chunk 1"):
        kb.add_chunks([Chunk("another good one"), Chunk(text)])
    assert [c.text for c in kb.chunks()] == ["a good chunk"]
