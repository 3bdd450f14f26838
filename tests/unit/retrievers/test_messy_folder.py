"""A real folder with damaged, encrypted and scanned PDFs, a noisy page and a hidden file: one
run ingests the good files and names every other one with its reason; ``strict`` names them all."""

from __future__ import annotations

import os
import uuid

import pytest

chromadb = pytest.importorskip("chromadb")
pytest.importorskip("pypdf")
pytest.importorskip("docx")
pytest.importorskip("trafilatura")

from adarag.config import RetrievalConfig  # noqa: E402
from adarag.errors import InputError  # noqa: E402
from adarag.retrievers import KnowledgeBase  # noqa: E402
from adarag.retrievers.chunking import read_source_file  # noqa: E402
from adarag.retrievers.file_types import unsupported_type_message  # noqa: E402
from tests.documents import pdf_bytes  # noqa: E402
from tests.unit.retrievers.messy_documents import (  # noqa: E402
    GOOD_FILES,
    NOISY_FACT,
    PRINTED_FACT,
    messy_folder,
)
from tests.unit.retrievers.test_knowledge_base import WordEmbedder, WordTokenizer  # noqa: E402

LEFT_OUT = {
    ".hidden.md": "a hidden file",
    "notes.xyz": "unsupported type .xyz",
    "photo.png": "unsupported type .png",
    "cut.pdf": "cannot be read as a PDF",
    "locked.pdf": "an encrypted PDF; save a copy without a password",
    "scan.pdf": "no text layer: a scanned PDF needs text recognition (OCR) first",
}


@pytest.fixture()
def client():
    return chromadb.EphemeralClient()


@pytest.fixture()
def kb(client):
    config = RetrievalConfig(collection=f"messy-{uuid.uuid4().hex[:8]}", chunk_tokens=64)
    base = KnowledgeBase(config, client=client, embedder=WordEmbedder())
    yield base
    if config.collection in {c.name for c in client.list_collections()}:
        client.delete_collection(config.collection)


def test_one_run_ingests_the_good_files_and_names_each_other_one_with_its_reason(kb, tmp_path):
    folder = messy_folder(tmp_path / "kb")
    report = kb.ingest([folder], tokenizer=WordTokenizer())
    assert report.num_files == len(GOOD_FILES) and report.num_files_unchanged == 0
    named = {item.path.name: item.reason for item in report.skipped}
    named |= {item.path.name: item.reason for item in report.unreadable}
    named |= {item.path.name: item.reason for item in report.empty}
    assert set(named) == set(LEFT_OUT)
    for name, reason in LEFT_OUT.items():
        assert named[name].startswith(reason), (name, named[name])
    assert [item.path.name for item in report.empty] == ["scan.pdf"]
    assert sorted({os.path.basename(c.metadata["source"]) for c in kb.chunks()}) == GOOD_FILES
    texts = "\n".join(chunk.text for chunk in kb.chunks())
    assert PRINTED_FACT in texts and NOISY_FACT in texts
    assert "draft nobody should search" not in texts

    again = kb.ingest([folder], tokenizer=WordTokenizer())  # the scan is never "unchanged"
    assert again.num_files_unchanged == len(GOOD_FILES) and again.added == ()
    assert [item.path.name for item in again.empty] == ["scan.pdf"]


def test_strict_fails_naming_every_file_left_out_and_leaves_no_collection(kb, client, tmp_path):
    folder = messy_folder(tmp_path / "kb")
    with pytest.raises(InputError) as raised:
        kb.ingest([folder], tokenizer=WordTokenizer(), strict=True)
    message = str(raised.value)
    assert message.startswith("6 file(s) are not read or hold no text: ")
    for name, reason in LEFT_OUT.items():
        assert f"{folder / name} ({reason}" in message, name
    assert "turn strict (--strict) off" in message
    assert kb.config.collection not in {c.name for c in client.list_collections()}
    assert kb.ingest([folder], tokenizer=WordTokenizer()).num_files == len(GOOD_FILES)


def test_a_failed_ingest_keeps_a_collection_that_was_there(kb, client, tmp_path):
    folder = messy_folder(tmp_path / "kb")
    kb.ingest([folder / "storage.md"], tokenizer=WordTokenizer())
    with pytest.raises(InputError):
        kb.ingest([folder], tokenizer=WordTokenizer(), strict=True)
    assert kb.count() > 0


def test_a_hidden_folder_is_named_once_and_not_walked(kb, tmp_path):
    folder = messy_folder(tmp_path / "kb")
    (folder / ".git" / "objects").mkdir(parents=True)
    (folder / ".git" / "objects" / "notes.md").write_text("not a document")
    report = kb.ingest([folder], tokenizer=WordTokenizer())
    hidden = [item for item in report.skipped if item.path.name.startswith(".")]
    assert [(item.path.name, item.reason) for item in hidden] == [
        (".git", "a hidden folder, not read"),
        (".hidden.md", "a hidden file"),
    ]


def test_a_file_given_by_name_of_another_type_gets_the_servers_message(kb, tmp_path):
    folder = messy_folder(tmp_path / "kb")
    with pytest.raises(InputError) as raised:
        kb.ingest([folder / "notes.xyz"], tokenizer=WordTokenizer())
    assert str(raised.value) == unsupported_type_message(folder / "notes.xyz")
    assert str(raised.value).startswith(f"{folder / 'notes.xyz'}: unsupported type .xyz; ")
    assert ".xhtml" in str(raised.value) and ".markdown" in str(raised.value)


def test_every_unreadable_file_given_by_name_is_named_at_once(kb, client, tmp_path):
    folder = messy_folder(tmp_path / "kb")
    with pytest.raises(InputError, match=r"^2 file\(s\) cannot be read: .*cut\.pdf.*locked\.pdf"):
        kb.ingest([folder / "cut.pdf", folder / "locked.pdf"], tokenizer=WordTokenizer())
    assert kb.config.collection not in {c.name for c in client.list_collections()}


def test_a_scanned_pdf_reads_as_empty_with_its_reason(tmp_path):
    path = tmp_path / "scan.pdf"
    path.write_bytes(pdf_bytes([[], []]))
    source = read_source_file(path)
    assert source.documents == ()
    assert source.empty_reason == "no text layer: a scanned PDF needs text recognition (OCR) first"
    (tmp_path / "blank.md").write_text("  \n")
    assert read_source_file(tmp_path / "blank.md").empty_reason == "holds no text"
