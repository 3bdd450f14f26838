"""Web pages of other sites, and names pointed at the server (DNS rebinding), reach nothing.

With no API key (how ``adarag serve`` starts), a page on any site could once add or replace
documents with a form post (multipart is a "simple" request, sent without asking the server),
send a JSON document as ``text/plain``, or query; and a page whose host name resolves to
127.0.0.1 could read every route. Each request here is what such a browser sends: a foreign
``Origin``, or a foreign ``Host``. (The same attack from headless Chromium is
``tests/integration/test_cross_origin_page.py``.)
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.reliability.http_server import Served
from tests.reliability.kb_server import kb_serving, listed

EVIL = "http://evil.example"
ALLOWED = "https://app.example.com"


@pytest.fixture(scope="module")
def server(tiny_checkpoints, tmp_path_factory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("origins")
    with kb_serving(
        tiny_checkpoints["llama"],
        root,
        allowed_origins=(ALLOWED,),
        allowed_hosts=("kb.internal",),
    ) as (served, _):
        yield served


def upload(served: Served, name: str, headers: dict[str, str], **body) -> httpx.Response:
    if not body:
        files = {"file": (name, b"# planted\n\nthe gate code is 0000\n")}
        body = {"files": files, "data": {"purpose": "assistants"}}
    return httpx.post(f"{served.url}/v1/files", headers=headers, timeout=60, **body)


def query(served: Served, headers: dict[str, str]) -> httpx.Response:
    body = {"question": "what is the code?", "chunks": ["the code is 1"], "max_new_tokens": 1}
    return httpx.post(f"{served.url}/v1/rag/query", json=body, headers=headers, timeout=60)


def test_a_page_of_another_origin_can_neither_add_documents_nor_query(server, ledger):
    """Before: a form post from any page added documents."""
    attempts = [
        upload(server, "planted.md", {"Origin": EVIL}),
        upload(server, "planted.md", {"Origin": "null"}),  # a sandboxed frame, a file: page
        upload(
            server,
            "planted.md",
            {"Origin": EVIL, "Content-Type": "text/plain"},
            content=b'{"filename": "planted.md", "text": "the gate code is 0000"}',
        ),
        upload(server, "planted.md", {"Origin": EVIL}, json={"filename": "p.md", "text": "x"}),
        upload(server, "planted.md", {"Origin": f"http://127.0.0.1:{server.port + 1}"}),
        query(server, {"Origin": EVIL}),
        httpx.get(f"{server.url}/v1/files", headers={"Origin": EVIL}),
    ]
    for reply in attempts:
        assert reply.status_code == 403, reply.text
        assert reply.json()["error"]["code"] == "origin_not_allowed"
        assert "serve.allowed_origins" in reply.json()["error"]["message"]
    assert "planted.md" not in listed(server) and "p.md" not in listed(server)
    ledger.record("HTTP: request from a page of another origin", cases=len(attempts))


def test_the_servers_own_pages_allowed_origins_and_plain_clients_are_served(server):
    own = {"Origin": server.url}
    assert upload(server, "own.md", own).status_code == 200
    assert upload(server, "allowed.md", {"Origin": ALLOWED}).status_code == 200
    assert upload(server, "plain.md", {}).status_code == 200  # curl, OpenAI's client
    assert query(server, own).status_code == 200
    assert {"own.md", "allowed.md", "plain.md"} <= set(listed(server))


def test_pages_of_allowed_origins_may_read_answers(server):
    preflight = httpx.options(
        f"{server.url}/v1/rag/query",
        headers={
            "Origin": ALLOWED,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
    )
    assert preflight.status_code == 200, preflight.text
    assert preflight.headers["access-control-allow-origin"] == ALLOWED
    listing = httpx.get(f"{server.url}/v1/files", headers={"Origin": ALLOWED})
    assert listing.headers["access-control-allow-origin"] == ALLOWED
    own = httpx.get(f"{server.url}/v1/files", headers={"Origin": server.url})
    assert "access-control-allow-origin" not in own.headers  # the same origin needs none


def test_a_host_name_the_server_does_not_answer_to_is_refused(server, ledger):
    """Before: DNS rebinding reached every route (no Host check)."""
    rebound = {"Host": f"evil.example:{server.port}"}
    attempts = [
        httpx.get(f"{server.url}/v1/files", headers=rebound),
        httpx.get(f"{server.url}/health", headers=rebound),
        httpx.get(f"{server.url}/", headers=rebound),
        upload(server, "rebound.md", {**rebound, "Origin": f"http://evil.example:{server.port}"}),
        query(server, rebound),
        httpx.get(f"{server.url}/v1/files", headers={"Host": "10.0.0.1.evil.example"}),
    ]
    for reply in attempts:
        assert reply.status_code == 403, reply.text
        assert "serve.allowed_hosts" in reply.json()["error"]["message"]
    assert "rebound.md" not in listed(server)
    for host in ("localhost", "127.0.0.1", "127.0.0.2", "kb.internal", "app.localhost"):
        reply = httpx.get(f"{server.url}/v1/files", headers={"Host": f"{host}:{server.port}"})
        assert reply.status_code == 200, (host, reply.text)
    ledger.record("HTTP: Host of another name (DNS rebinding)", cases=len(attempts))


def test_an_upload_must_say_it_is_multipart_or_json(server, ledger):
    """Before: any body not multipart was parsed as JSON, whatever its Content-Type."""
    text = b'{"filename": "typed.md", "text": "the gate code is 0000"}'
    attempts = [
        upload(server, "typed.md", {"Content-Type": "text/plain"}, content=text),
        upload(server, "typed.md", {"Content-Type": ""}, content=text),
        upload(
            server,
            "typed.md",
            {"Content-Type": "application/x-www-form-urlencoded"},
            content=b"filename=typed.md&text=x",
        ),
    ]
    for reply in attempts:
        assert reply.status_code == 415, reply.text
        assert "multipart/form-data" in reply.json()["error"]["message"]
        assert reply.headers["connection"] == "close"  # the body is left unread
    assert "typed.md" not in listed(server)
    json_body = {"Content-Type": "application/json"}
    assert upload(server, "typed.md", json_body, content=text).status_code == 200
    ledger.record("HTTP: upload with a simple (form or text) Content-Type", cases=len(attempts))
