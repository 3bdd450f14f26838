"""Sentence- and heading-aware splitting with the model's tokenizer, and stable chunk ids."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

chromadb = pytest.importorskip("chromadb")

from adarag.cli.display import _label  # noqa: E402
from adarag.config import RetrievalConfig  # noqa: E402
from adarag.retrievers import KnowledgeBase  # noqa: E402
from adarag.retrievers.chunking import tokenizer_spans  # noqa: E402
from adarag.retrievers.splitting import markdown_sections, split_sentences  # noqa: E402
from adarag.schema import Chunk  # noqa: E402
from tests.unit.retrievers.test_knowledge_base import WordEmbedder  # noqa: E402

SENTENCES = [
    "Paris is the capital of France.",
    "The Seine runs through it!",
    "Berlin is the capital of Germany?",
    "The quick brown fox jumps over the lazy dog near the river.",
    "Question answer passages.",
]
GUIDE = """# Guide
Paris is the capital of France. The Seine runs through it.

## Install
Berlin is the capital of Germany. The Spree runs through Berlin. The quick brown fox jumps.

```
# not a heading
```

## Usage
The quick brown fox jumps over the lazy dog. Paris is the capital of France.
"""


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoints):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_checkpoints["llama"])


def _num_tokens(tokenizer, text):
    return len(tokenizer.encode(text, add_special_tokens=False))


@pytest.mark.parametrize("budget", [20, 40, 80])
def test_chunks_end_at_sentences_within_the_token_budget(tokenizer, budget):
    text = " ".join(SENTENCES * 3)
    chunks = split_sentences(text, tokenizer_spans(tokenizer), budget, 8)
    assert len(chunks) > 1
    for chunk in chunks:
        assert _num_tokens(tokenizer, chunk) <= budget
        over_long = any(
            _num_tokens(tokenizer, sentence) > budget and chunk in sentence
            for sentence in SENTENCES
        )
        assert chunk[-1] in ".!?" or over_long
    words = {word for chunk in chunks for word in chunk.split()}
    assert words == set(text.split())  # nothing is lost


def test_a_sentence_over_the_budget_is_cut_between_words(tokenizer):
    long_sentence = " ".join(["the quick brown fox"] * 20) + "."
    text = f"Paris is the capital of France. {long_sentence} The Seine runs through it."
    chunks = split_sentences(text, tokenizer_spans(tokenizer), 24, 0)
    assert chunks[0] == "Paris is the capital of France."
    assert chunks[-1] == "The Seine runs through it."
    assert all(_num_tokens(tokenizer, chunk) <= 24 for chunk in chunks)
    assert " ".join(chunks[1:-1]).split() == long_sentence.split()


def test_markdown_sections_follow_headings_outside_code():
    sections = markdown_sections(GUIDE)
    assert [s.heading for s in sections] == ["Guide", "Guide > Install", "Guide > Usage"]
    assert sections[1].text.startswith("## Install") and "# not a heading" in sections[1].text


@pytest.fixture()
def make_kb():
    client = chromadb.EphemeralClient()
    name = f"kb-{uuid.uuid4().hex[:8]}"

    def make(**fields):
        config = RetrievalConfig(collection=name, chunk_tokens=24, chunk_overlap_tokens=4, **fields)
        return KnowledgeBase(config, client=client, embedder=WordEmbedder())

    yield make
    client.delete_collection(name)


def _by_heading(kb):
    found: dict[str, set[str]] = {}
    for chunk in kb.chunks():
        found.setdefault(chunk.metadata["heading"], set()).add(str(chunk.chunk_id))
    return found


def test_headings_start_chunks_and_one_changed_section_changes_only_its_chunks(
    make_kb, tokenizer, tmp_path
):
    kb = make_kb()
    doc = tmp_path / "guide.md"
    doc.write_text(GUIDE)
    kb.ingest([doc], tokenizer=tokenizer)
    chunks = sorted(kb.chunks(), key=lambda chunk: chunk.metadata["chunk_idx"])
    assert len(chunks) > 3
    for before, chunk in zip([None, *chunks], chunks, strict=False):
        assert _num_tokens(tokenizer, chunk.text) <= 24
        if before is None or before.metadata["heading"] != chunk.metadata["heading"]:
            assert chunk.text.startswith("#")  # a section's first chunk opens with its heading
    assert "§ Guide > Install" in _label(
        next(c for c in chunks if "Install" in c.metadata["heading"])
    )
    ids = _by_heading(kb)
    assert kb.ingest([doc], tokenizer=tokenizer).num_files_unchanged == 1  # same ids, no work
    doc.write_text(GUIDE.replace("The Spree runs through Berlin.", "The Spree flows there."))
    report = kb.ingest([doc], tokenizer=tokenizer)
    assert {c.metadata["heading"] for c in report.added} == {"Guide > Install"}
    changed = _by_heading(kb)
    assert changed["Guide"] == ids["Guide"] and changed["Guide > Usage"] == ids["Guide > Usage"]
    assert changed["Guide > Install"] != ids["Guide > Install"]


def test_a_file_split_by_another_splitter_is_split_again(make_kb, tokenizer, tmp_path):
    doc = tmp_path / "notes.txt"
    doc.write_text(" ".join(SENTENCES * 2))
    first = make_kb(splitter="tokens")
    first.ingest([doc], tokenizer=tokenizer)
    again = make_kb()  # the same collection, the default splitter
    report = again.ingest([doc], tokenizer=tokenizer)
    assert report.num_files_unchanged == 0
    assert all(c.metadata["splitter"] == "markdown" for c in again.chunks())
    resplit = split_sentences(doc.read_text(), tokenizer_spans(tokenizer), 24, 4)
    assert sorted(c.text for c in again.chunks()) == sorted(resplit)


def test_chunks_of_a_text_file_label_no_heading():
    assert "§" not in _label(Chunk("x", metadata={"source": str(Path("a.txt"))}))
