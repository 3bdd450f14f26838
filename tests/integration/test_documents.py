"""The real model over PDF, Word, HTML and CSV files: ``adarag ingest`` and ``adarag ask``, and a
LlamaIndex ``SentenceSplitter`` whose unchanged chunks keep their ids and KV on a re-ingest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adarag import AdaRagConfig
from adarag.cli import main as cli_main
from adarag.errors import KnowledgeBaseError
from adarag.retrievers import KnowledgeBase
from tests.documents import CSV_FACT, HTML_FACT, mixed_folder
from tests.unit.retrievers.messy_documents import GOOD_FILES, messy_folder

pytestmark = pytest.mark.integration
pytest.importorskip("pypdf")
pytest.importorskip("docx")


@pytest.fixture(scope="module")
def cli_config(real_config, tmp_path_factory) -> tuple[Path, Path]:
    """(config file, folder of mixed documents) of a home of its own."""
    root = tmp_path_factory.mktemp("documents-cli")
    config = root / "config.json"
    settings = {"home": str(root / "home"), "engine": {"model": real_config.engine.model}}
    config.write_text(json.dumps(settings))
    return config, mixed_folder(root / "docs")


def stored_chunks(config: Path) -> list:
    with KnowledgeBase.from_config(AdaRagConfig.from_file(config)) as kb:
        return kb.chunks()


def test_strict_ingest_of_a_folder_with_an_unread_file_exits_2_and_stores_nothing(
    cli_config, capsys
):
    config, folder = cli_config
    status = cli_main(["--config", str(config), "ingest", "--strict", "--no-warm", str(folder)])
    lines = capsys.readouterr().err.splitlines()
    err = [line for line in lines if line.startswith("adarag ingest: error: ")]
    assert status == 2 and len(err) == 1
    assert err[0].startswith("adarag ingest: error: 1 file(s)")
    assert "notes.xyz (unsupported type .xyz)" in err[0]
    assert stored_chunks(config) == []


def test_ingest_reads_each_document_names_the_skipped_file_and_ask_cites_pdf_and_docx(
    cli_config, capfd
):
    config, folder = cli_config
    assert cli_main(["--config", str(config), "ingest", str(folder)]) == 0
    out = capfd.readouterr().out
    assert "ingested 5 file(s), 0 unchanged" in out
    assert f"skipped 1 file(s):\n  {folder / 'notes.xyz'} (unsupported type .xyz)\n" in out
    chunks = stored_chunks(config)
    html = [c for c in chunks if c.metadata["source"].endswith("guide.html")]
    assert any(HTML_FACT in c.text for c in html)
    assert all("<" not in c.text and "#" not in c.text and "var x" not in c.text for c in html)
    assert any(CSV_FACT[2] in c.text and c.metadata["row"] == 1 for c in chunks)

    for question, fact, source in (
        ("What is the north gate access code?", "4417", "gate-manual.pdf, chunk 2/2, page 2"),
        ("When does the pool open on weekdays?", "6 a.m.", "pool.docx, chunk 1/2"),
    ):
        assert cli_main(["--config", str(config), "ask", question]) == 0
        out = capfd.readouterr().out  # the answer streams to the process's stdout
        answer = out.split("answer: ", 1)[1].splitlines()[0]
        first_source = next(line for line in out.splitlines() if "source 1:" in line)
        assert fact in answer, out
        assert first_source.endswith(source) or f"{source}," in first_source, out


def test_a_messy_folder_fails_strict_naming_every_file_then_ingests_in_one_run(
    real_config, tmp_path, capsys
):
    """A damaged, an encrypted and a scanned PDF, a hidden file and two other types: --strict
    names all six and leaves no collection; without it one run ingests the rest and lists them."""
    pytest.importorskip("trafilatura")
    folder = messy_folder(tmp_path / "kb")
    config = tmp_path / "config.json"
    settings = {"home": str(tmp_path / "home"), "engine": {"model": real_config.engine.model}}
    config.write_text(json.dumps(settings))
    left_out = [
        ".hidden.md (a hidden file)",
        "notes.xyz (unsupported type .xyz)",
        "photo.png (unsupported type .png)",
        "cut.pdf (cannot be read as a PDF",
        "locked.pdf (an encrypted PDF",
        "scan.pdf (no text layer: a scanned PDF needs text recognition (OCR) first)",
    ]

    argv = ["--config", str(config), "ingest", "--no-warm", str(folder)]
    assert cli_main([*argv, "--strict"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(err) == 1 and "6 file(s) are not read or hold no text" in err[0]
    for item in left_out:
        assert f"{folder}/{item}" in err[0], item
    with pytest.raises(KnowledgeBaseError, match="there is no collection 'adarag'"):
        KnowledgeBase.from_config(AdaRagConfig.from_file(config), create=False)

    assert cli_main(argv) == 0
    out = capsys.readouterr().out
    assert f"ingested {len(GOOD_FILES)} file(s), 0 unchanged" in out
    for heading in ("skipped 3 file(s):", "could not read 2 file(s):", "no text in 1 file(s):"):
        assert f"\n{heading}\n" in out, heading
    for item in left_out:
        assert f"\n  {folder}/{item}" in out, item


def test_a_sentence_splitter_s_unchanged_chunks_keep_their_ids_and_kv(shared_rag, tmp_path):
    splitters = pytest.importorskip("llama_index.core.node_parser")
    splitter = splitters.SentenceSplitter(chunk_size=48, chunk_overlap=0)
    rag = shared_rag.with_config(cache={"store": {"directory": str(tmp_path / "kv")}})
    retrieval = rag.config.retrieval.model_copy(
        update={"chroma_directory": tmp_path / "chroma", "collection": "splitter"}
    )
    sections = {
        "Install": "Download the installer. Run it and pick a folder. " * 8,
        "Use": "Open the app. Choose a file and press start. " * 8,
        "Remove": "Delete the folder. Nothing else stays behind. " * 8,
    }
    guide = tmp_path / "guide.md"
    guide.write_text("".join(f"## {title}\n{body}\n\n" for title, body in sections.items()))
    with KnowledgeBase(retrieval, splitter=splitter) as kb:
        first = kb.ingest([guide], tokenizer=rag.tokenizer)
        assert {c.metadata["splitter"] for c in kb.chunks()} == {kb.splitter_name}
        assert "SentenceSplitter(chunk_size=48, chunk_overlap=0)" in kb.splitter_name
        assert len(first.added) > len(sections)  # the splitter cut inside sections
        assert rag.warm(kb.chunks()) == len(first.added)
        before = {c.chunk_id: c for c in kb.chunks()}

        guide.write_text(guide.read_text().replace("press start", "press go"))
        second = kb.ingest([guide], tokenizer=rag.tokenizer)
        after = {c.chunk_id: c for c in kb.chunks()}
        kept = set(before) & set(after)
        assert second.num_chunks_kept == len(kept) > 0
        assert {before[i].metadata["heading"] for i in set(before) - kept} == {"Use"}
        for chunk_id in kept:  # same id, same text, KV still cached under it
            assert after[chunk_id].text == before[chunk_id].text
            assert rag.cache.has_independent(rag.prompts.chunk_ids(after[chunk_id].text))
        assert rag.warm(list(after.values())) == len(second.added)  # only the new ones
