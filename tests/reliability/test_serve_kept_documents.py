"""What the documents directory holds across crashes, and the names documents are kept under.

- A staged upload a crash left behind (up to ``serve.max_upload_bytes`` each) was never removed;
  the server now sweeps those of ended processes when it starts.
- A document whose warming a crash cut short was listed ``processed`` after the restart with
  chunks lacking their KV, and was never warmed; the server now warms the documents sent before
  it started again, listing each as warming until its KV is complete.
- Names with bidirectional overrides (U+202E) or markup were stored and listed verbatim; a kept
  name now holds only letters, marks, digits, spaces and a few punctuation marks.
"""

from __future__ import annotations

import os
import subprocess

import httpx

from tests.reliability.http_server import serving
from tests.reliability.kb_server import kb_rag, kb_serving, listed, wait_processed

PURPOSE = {"purpose": "assistants"}  # every multipart upload names one
LODGE = "\n\n".join(
    f"# Section {idx}\n\nThe lodge keeps record {idx} of the gate, the bikes and the bins."
    for idx in range(6)
)


def test_staged_uploads_of_ended_processes_are_swept_at_start(tiny_checkpoints, tmp_path, ledger):
    """Before: a staged upload left by a crash was never swept."""
    ended = subprocess.Popen(["true"])
    ended.wait()
    staging = tmp_path / "documents" / ".incoming"
    left = [staging / f"{ended.pid}-0123abcd", staging / "5f0e1d2c3b4a59687766554433221100"]
    live = staging / f"{os.getpid()}-live"
    for folder in (*left, live):
        folder.mkdir(parents=True)
        (folder / "big.md").write_bytes(b"w " * 512 * 1024)
    with kb_serving(tiny_checkpoints["llama"], tmp_path) as (served, _):
        assert listed(served) == {}
        assert not any(folder.exists() for folder in left)
        assert (live / "big.md").exists()  # a running process's upload stays
    ledger.record("documents: staged upload left by a crash", cases=len(left))


def test_a_document_whose_warming_was_cut_short_is_warmed_after_a_restart(
    tiny_checkpoints, tmp_path, ledger
):
    """Before: it was listed processed, its KV never completed."""
    rag, kb = kb_rag(tiny_checkpoints["llama"], tmp_path, chunk_tokens=16, chunk_overlap_tokens=0)
    documents = tmp_path / "documents"
    documents.mkdir()
    (documents / "lodge.md").write_text(LODGE)
    with kb:
        kb.ingest([documents / "lodge.md"], tokenizer=rag.tokenizer)  # stored, then the crash:
        chunks = kb.chunks()
        assert len(chunks) > 2
        rag.warm(chunks[:1])  # only the first chunk's KV was computed
        with serving(rag, api_key=None, documents_directory=documents) as served:
            entry = wait_processed(served, "lodge.md")
            assert entry["status"] == "processed", entry
            assert rag.warm(kb.chunks()) == 0  # every chunk's KV is stored now
    ledger.record("documents: warming cut short by a crash", cases=1)


def test_names_with_bidi_overrides_or_markup_are_refused(tiny_checkpoints, tmp_path, ledger):
    """Before: such names were stored and listed verbatim."""
    refused = [
        "invoice\u202etxt.md",
        "<script>alert(1)</script>.md",
        "line\u2028break.md",
        "zero\u200bwidth.md",
        "tab\u3000wide.md",
    ]
    kept = ["Résumé (v2).md", "报告 2026.md", "notes_final-3.md"]
    with kb_serving(tiny_checkpoints["llama"], tmp_path) as (served, _):
        for name in refused:
            reply = httpx.post(
                f"{served.url}/v1/files",
                files={"file": (name, b"# a\n\nwords\n")},
                data=PURPOSE,
                timeout=60,
            )
            assert reply.status_code == 400, (name, reply.text)
            message = reply.json()["error"]["message"]
            assert "rename it" in message and "U+" in message
            assert "\u202e" not in message and "<script>" not in message
        for name in kept:
            reply = httpx.post(
                f"{served.url}/v1/files",
                files={"file": (name, b"# a\n\nwords\n")},
                data=PURPOSE,
                timeout=60,
            )
            assert reply.status_code == 200, (name, reply.text)
        assert set(listed(served)) == set(kept)
    ledger.record("documents: names with bidi overrides, markup or invisibles", cases=len(refused))
