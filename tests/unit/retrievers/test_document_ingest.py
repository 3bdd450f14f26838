"""A folder of mixed documents ingested: what is read, what is named as skipped, --strict."""

from __future__ import annotations

import os
import uuid

import pytest

chromadb = pytest.importorskip("chromadb")
pytest.importorskip("pypdf")
pytest.importorskip("docx")

from adarag.config import RetrievalConfig  # noqa: E402
from adarag.errors import InputError  # noqa: E402
from adarag.retrievers import KnowledgeBase  # noqa: E402
from tests.documents import DOCX_FACT, HTML_FACT, PDF_FACT, mixed_folder  # noqa: E402
from tests.unit.retrievers.test_knowledge_base import WordEmbedder, WordTokenizer  # noqa: E402


@pytest.fixture()
def kb():
    config = RetrievalConfig(collection=f"docs-{uuid.uuid4().hex[:8]}", chunk_tokens=64)
    base = KnowledgeBase(config, client=chromadb.EphemeralClient(), embedder=WordEmbedder())
    yield base
    base.collection._client.delete_collection(config.collection)


def by_file(kb) -> dict[str, list]:
    found: dict[str, list] = {}
    for chunk in kb.chunks():
        found.setdefault(os.path.basename(chunk.metadata["source"]), []).append(chunk)
    return found


def test_a_mixed_folder_ingests_each_document_and_names_the_file_it_skips(kb, tmp_path):
    folder = mixed_folder(tmp_path / "docs")
    os.mkfifo(folder / "pipe.md")
    report = kb.ingest([folder], tokenizer=WordTokenizer())
    assert report.num_files == 5
    assert [(item.path.name, item.reason) for item in report.skipped] == [
        ("notes.xyz", "unsupported type .xyz"),
        ("pipe.md", "a FIFO (named pipe), not a regular file"),
    ]
    files = by_file(kb)
    assert sorted(files) == [
        "contacts.csv",
        "gate-manual.pdf",
        "guide.html",
        "pool.docx",
        "storage.md",
    ]
    html = {chunk.metadata.get("heading"): chunk for chunk in files["guide.html"]}
    assert set(html) == {None, "Deliveries", "Deliveries > Opening hours"}
    assert html["Deliveries"].text == f"Residents' guide\nDeliveries\n{HTML_FACT}"
    for chunk in html.values():
        assert chunk.metadata["title"] == "Residents' guide"
        assert chunk.text.startswith("Residents' guide\n")  # the page title leads each chunk
        for markup in ("<", "#", "var x", "color:red", "tracking", "draft text"):
            assert markup not in chunk.text, markup
    pdf_pages = {chunk.metadata["page"]: chunk.text for chunk in files["gate-manual.pdf"]}
    assert PDF_FACT in pdf_pages[2] and PDF_FACT not in pdf_pages[1]
    docx_headings = {chunk.metadata.get("heading") for chunk in files["pool.docx"]}
    assert docx_headings == {"Opening times", "Safety"}
    assert any(DOCX_FACT in chunk.text for chunk in files["pool.docx"])
    rows = sorted(chunk.metadata["row"] for chunk in files["contacts.csv"])
    assert rows == [1, 2]


def test_strict_refuses_a_folder_with_a_file_it_would_skip_and_stores_nothing(kb, tmp_path):
    folder = mixed_folder(tmp_path / "docs")
    with pytest.raises(
        InputError, match=r"1 file\(s\) .* not read .*: .*notes\.xyz \(unsupported type \.xyz\)"
    ):
        kb.ingest([folder], tokenizer=WordTokenizer(), strict=True)
    assert kb.count() == 0
    (folder / "notes.xyz").unlink()
    assert kb.ingest([folder], tokenizer=WordTokenizer(), strict=True).num_files == 5


def test_a_folder_without_a_readable_file_names_what_it_holds(kb, tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    (folder / "photo.png").write_bytes(b"\x89PNG")
    with pytest.raises(InputError, match=r"holds no file ingest reads .*photo\.png \(unsupported"):
        kb.ingest([folder], tokenizer=WordTokenizer())


def test_a_document_given_by_name_that_cannot_be_read_stores_nothing_of_the_others(kb, tmp_path):
    folder = mixed_folder(tmp_path / "docs")
    broken = tmp_path / "broken.docx"
    broken.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(InputError, match=r"broken\.docx.* cannot be"):
        kb.ingest([folder, broken], tokenizer=WordTokenizer())
    assert kb.count() == 0
