"""Documents over HTTP (``/v1/files``) on a tiny model and an in-memory Chroma.

A document sent is read at once (bad ones are refused and change nothing), kept under its name,
then embedded, stored and warmed in the background; answers cite it until it is deleted.
"""

from __future__ import annotations

import stat
import time

import pytest

chromadb = pytest.importorskip("chromadb")
pytest.importorskip("pypdf")
pytest.importorskip("multipart")

from tests.documents import PDF_FACT, pdf_bytes  # noqa: E402
from tests.unit.serve.conftest import AUTH  # noqa: E402

QUESTION = "what is the north gate access code?"


def wait_until_processed(client, file_id: str) -> dict:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        body = client.get(f"/v1/files/{file_id}", headers=AUTH).json()
        if body["status"] != "uploaded":
            return body
        time.sleep(0.05)
    raise AssertionError(f"{file_id} was not processed in time")


def ask(client, question: str = QUESTION) -> list[str]:
    body = {"model": "m", "messages": [{"role": "user", "content": question}], "max_tokens": 2}
    reply = client.post("/v1/chat/completions", json=body, headers=AUTH)
    assert reply.status_code == 200, reply.text
    return [source["metadata"]["source"] for source in reply.json()["adarag"]["sources"]]


def send_pdf(client, name: str = "gate-manual.pdf"):
    data = pdf_bytes([["Gate manual"], ["Access", PDF_FACT]])
    return client.post(
        "/v1/files",
        files={"file": (name, data, "application/pdf")},
        data={"purpose": "assistants"},
        headers=AUTH,
    )


def test_a_sent_file_is_stored_warmed_cited_and_forgotten_when_deleted(served):
    client, rag, kb, directory = served
    sent = send_pdf(client)
    assert sent.status_code == 200, sent.text
    body = sent.json()
    assert body["object"] == "file" and body["filename"] == "gate-manual.pdf"
    assert body["status"] == "uploaded" and body["purpose"] == "assistants"
    done = wait_until_processed(client, body["id"])
    assert done["status"] == "processed" and done["adarag"]["num_chunks"] == 2  # two pages
    assert (directory / "gate-manual.pdf").read_bytes()[:5] == b"%PDF-"
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700  # other users cannot list it
    chunks = kb.chunks(sources=[str((directory / "gate-manual.pdf").resolve())])
    assert {chunk.metadata["page"] for chunk in chunks} == {1, 2}
    assert all(rag.cache.has_independent(rag.prompts.chunk_ids(c.text)) for c in chunks)
    listed = client.get("/v1/files", headers=AUTH).json()
    assert body["id"] in [item["id"] for item in listed["data"]]
    assert "gate-manual.pdf" in ask(client)

    deleted = client.delete(f"/v1/files/{body['id']}", headers=AUTH)
    assert deleted.json() == {"id": body["id"], "object": "file", "deleted": True}
    assert body["id"] not in [i["id"] for i in client.get("/v1/files", headers=AUTH).json()["data"]]
    assert not (directory / "gate-manual.pdf").exists()
    assert ask(client) == ["base.md"]
    assert client.get(f"/v1/files/{body['id']}", headers=AUTH).status_code == 404


def test_a_text_sent_as_json_keeps_its_headings_and_a_new_version_keeps_unchanged_chunks(served):
    client, _, kb, _ = served
    first = {
        "filename": "house.md",
        "text": "# Bikes\nBikes go to the basement.\n# Bins\nBins go out on monday.\n",
    }
    body = client.post("/v1/files", json=first, headers=AUTH).json()
    assert wait_until_processed(client, body["id"])["adarag"]["num_chunks"] == 2
    source = [s for s in kb.sources() if s.endswith("house.md")]
    before = {c.metadata["heading"]: c.chunk_id for c in kb.chunks(sources=source)}
    edited = {**first, "text": first["text"].replace("monday", "tuesday")}
    again = client.post("/v1/files", json=edited, headers=AUTH).json()
    assert again["id"] == body["id"]  # the same name is the same document
    wait_until_processed(client, again["id"])
    after = {c.metadata["heading"]: c.chunk_id for c in kb.chunks(sources=source)}
    assert after["Bikes"] == before["Bikes"] and after["Bins"] != before["Bins"]
    client.delete(f"/v1/files/{body['id']}", headers=AUTH)


@pytest.mark.parametrize(
    ("name", "data", "status", "message"),
    [
        ("notes.xyz", b"plain words", 400, "notes.xyz: unsupported type .xyz"),
        ("cut.pdf", b"%PDF-1.4\n1 0 obj <<", 400, "cut.pdf cannot be read as a PDF"),
        (".hidden.md", b"words", 400, "is not usable"),
        ("big.md", b"w " * 40_000, 413, "serve.max_upload_bytes"),
    ],
)
def test_a_document_that_cannot_be_kept_is_refused_and_changes_nothing(
    served, name, data, status, message
):
    client, _, kb, directory = served
    before = (sorted(kb.sources().items()), sorted(p.name for p in directory.glob("*")))
    reply = client.post(
        "/v1/files", files={"file": (name, data)}, data={"purpose": "assistants"}, headers=AUTH
    )
    assert reply.status_code == status and message in reply.json()["error"]["message"]
    assert str(directory) not in reply.text  # the server's paths stay private
    after = (sorted(kb.sources().items()), sorted(p.name for p in directory.glob("*")))
    assert after == before


def test_a_sent_path_keeps_only_its_file_name(served):
    client, _, _, directory = served
    reply = client.post(
        "/v1/files", json={"filename": "../../outside.md", "text": "a b c"}, headers=AUTH
    )
    assert reply.json()["filename"] == "outside.md"
    wait_until_processed(client, reply.json()["id"])
    assert (directory / "outside.md").is_file() and not (directory.parent / "outside.md").exists()
    client.delete(f"/v1/files/{reply.json()['id']}", headers=AUTH)


def test_documents_need_the_key_and_an_unknown_id_is_404(served):
    client = served[0]
    assert client.get("/v1/files").status_code == 401
    assert client.post("/v1/files", json={"text": "x"}).status_code == 401
    missing = client.delete("/v1/files/file-nope", headers=AUTH)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "file_not_found"


def test_a_scanned_pdf_is_processed_with_the_reason_it_holds_no_text(served):
    client, _, _, _ = served
    sent = client.post(
        "/v1/files",
        files={"file": ("scan.pdf", pdf_bytes([[], []]), "application/pdf")},
        data={"purpose": "assistants"},
        headers=AUTH,
    )
    assert sent.status_code == 200, sent.text
    done = wait_until_processed(client, sent.json()["id"])
    assert done["status"] == "processed" and done["adarag"]["num_chunks"] == 0
    assert "no text layer" in (done["status_details"] or "")
