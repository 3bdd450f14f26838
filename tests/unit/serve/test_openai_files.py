"""OpenAI's Files API through the official client, against a server on loopback.

The server starts over an empty knowledge base; ten documents are sent, then listed a page at a
time (``limit``, ``after``, ``order``), filtered by ``purpose`` and read back whole.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

chromadb = pytest.importorskip("chromadb")
openai = pytest.importorskip("openai")
pytest.importorskip("multipart")

from tests.reliability.http_server import Served, serving  # noqa: E402
from tests.unit.retrievers.test_knowledge_base import WordEmbedder  # noqa: E402

KEY = "files-key"
NUM_FILES = 10


@pytest.fixture(scope="module")
def server(tiny_checkpoints, tmp_path_factory) -> Iterator[Served]:
    """A server over a knowledge base that starts empty."""
    from adarag import AdaRAG, AdaRagConfig
    from adarag.retrievers import KnowledgeBase

    home = tmp_path_factory.mktemp("files-home")
    config = AdaRagConfig.build(
        home=home,
        engine={"model": str(tiny_checkpoints["llama"])},
        augment={"enabled": False},
        experimental={"augment": {"num_lens_layers": 2}},
        retrieval={"collection": f"files-{uuid.uuid4().hex[:8]}", "top_k": 2},
    )
    kb = KnowledgeBase(config.retrieval, client=chromadb.EphemeralClient(), embedder=WordEmbedder())
    rag = AdaRAG(config, retriever=kb)
    with serving(rag, KEY, documents_directory=home / "documents") as served:
        yield served


def client_of(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.base_url, api_key=KEY, max_retries=0, timeout=120)


def note(idx: int) -> bytes:
    return f"# Note {idx}\n\nroom {idx} keeps the spare keys number {idx}.\n".encode()


@pytest.fixture(scope="module")
def sent(server) -> dict[str, tuple[str, bytes]]:
    """Ten documents, every third with purpose ``user_data``: id -> (purpose, bytes)."""
    client = client_of(server)
    found = {}
    for idx in range(NUM_FILES):
        purpose = "user_data" if idx % 3 == 0 else "assistants"
        data = note(idx)
        created = client.files.create(file=(f"note-{idx:02d}.md", data), purpose=purpose)
        found[created.id] = (purpose, data)
    deadline = time.monotonic() + 120
    while any(client.files.retrieve(i).status == "uploaded" for i in found):
        assert time.monotonic() < deadline, "the notes were not processed in time"
        time.sleep(0.05)
    return found


def test_a_list_page_honours_limit_and_says_there_is_more(server, sent):
    client = client_of(server)
    page = client.files.list(limit=2)
    assert len(page.data) == 2 and page.has_more
    assert page.model_extra["first_id"] == page.data[0].id
    assert page.model_extra["last_id"] == page.data[1].id
    whole = client.files.list()
    assert len(whole.data) == NUM_FILES and not whole.has_more
    assert [f.id for f in page.data] == [f.id for f in whole.data[:2]]


def test_pages_follow_the_after_cursor_in_either_order(server, sent):
    client = client_of(server)
    newest_first = [f.id for f in client.files.list().data]
    assert sorted(newest_first) == sorted(sent)
    created = [f.created_at for f in client.files.list().data]
    assert created == sorted(created, reverse=True)  # OpenAI's default order is desc
    assert [f.id for f in client.files.list(limit=3)] == newest_first  # the client pages on
    assert [f.id for f in client.files.list(limit=4, order="asc")] == newest_first[::-1]
    after = client.files.list(limit=2, after=newest_first[7])
    assert [f.id for f in after.data] == newest_first[8:] and not after.has_more


def test_an_unknown_cursor_or_order_is_refused_naming_it(server, sent):
    client = client_of(server)
    with pytest.raises(openai.BadRequestError) as raised:
        client.files.list(after="file-unknown")
    assert raised.value.body["param"] == "after"
    with pytest.raises(openai.BadRequestError) as raised:
        client.files.list(order="sideways")  # type: ignore[arg-type]
    assert raised.value.body["param"] == "order"


def test_the_list_filters_by_purpose(server, sent):
    client = client_of(server)
    wanted = sorted(i for i, (purpose, _) in sent.items() if purpose == "user_data")
    listed = client.files.list(purpose="user_data")
    assert sorted(f.id for f in listed) == wanted
    assert all(f.purpose == "user_data" for f in listed)
    assert list(client.files.list(purpose="fine-tune")) == []


def test_a_files_content_is_its_bytes_as_sent(server, sent):
    client = client_of(server)
    for file_id, (_, data) in list(sent.items())[:3]:
        assert client.files.content(file_id).content == data
    with pytest.raises(openai.NotFoundError):
        client.files.content("file-unknown")
    some_id = next(iter(sent))
    assert httpx.get(f"{server.base_url}/files/{some_id}/content").status_code == 401
    foreign = httpx.get(
        f"{server.base_url}/files/{some_id}/content",
        headers={"Authorization": f"Bearer {KEY}", "Origin": "https://elsewhere.example"},
    )
    assert foreign.status_code == 403


def test_an_upload_without_purpose_is_refused_naming_it(server):
    reply = httpx.post(
        f"{server.base_url}/files",
        files={"file": ("no-purpose.md", b"# A\n\nwords\n")},
        headers={"Authorization": f"Bearer {KEY}"},
    )
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "purpose" and "purpose" in error["message"]
    names = [f.filename for f in client_of(server).files.list()]
    assert "no-purpose.md" not in names
