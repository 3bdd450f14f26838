"""``adarag serve`` over a knowledge base of its own, on loopback: the tiny model, bag-of-words
embeddings and a Chroma directory under the test's folder, so documents can be sent, listed and
asked about in seconds."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from adarag import AdaRAG, AdaRagConfig
from adarag.retrievers import KnowledgeBase
from tests.reliability.http_server import Served, serving
from tests.unit.retrievers.test_knowledge_base import WordEmbedder


def kb_rag(checkpoint: Path, root: Path, **retrieval: Any) -> tuple[AdaRAG, KnowledgeBase]:
    """A pipeline over the tiny checkpoint answering from a new knowledge base under ``root``."""
    config = AdaRagConfig.build(
        home=root / "home",
        engine={"model": str(checkpoint)},
        augment={"enabled": False},
        experimental={"augment": {"num_lens_layers": 2}},
        retrieval={
            "chroma_directory": str(root / "chroma"),
            "collection": f"kb-{uuid.uuid4().hex[:8]}",
            "top_k": 2,
            **retrieval,
        },
    )
    kb = KnowledgeBase(config.retrieval, embedder=WordEmbedder())
    return AdaRAG(config, retriever=kb), kb


@contextmanager
def kb_serving(
    checkpoint: Path,
    root: Path,
    api_key: str | None = None,
    retrieval: dict[str, Any] | None = None,
    **serve: Any,
) -> Iterator[tuple[Served, KnowledgeBase]]:
    """A server (no API key by default, as ``adarag serve`` starts) over a new knowledge base."""
    rag, kb = kb_rag(checkpoint, root, **(retrieval or {}))
    with kb, serving(rag, api_key=api_key, documents_directory=root / "documents", **serve) as s:
        yield s, kb


def listed(served: Served, headers: dict[str, str] | None = None) -> dict[str, dict]:
    """The documents the server lists, by file name."""
    reply = httpx.get(f"{served.url}/v1/files", headers=headers or {}, timeout=60)
    assert reply.status_code == 200, reply.text
    return {entry["filename"]: entry for entry in reply.json()["data"]}


def wait_processed(served: Served, name: str, timeout_s: float = 120) -> dict:
    """The listing of ``name`` once it is processed (or failed)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        entry = listed(served).get(name)
        if entry is not None and entry["status"] != "uploaded":
            return entry
        time.sleep(0.1)
    raise AssertionError(f"{name} was not processed within {timeout_s} s")


def start_kb_server_process(checkpoint: Path, root: Path, settings: str) -> tuple[Any, str]:
    """``adarag serve`` over a tiny knowledge base in a process of its own; (process, URL).

    ``settings`` is the JSON of its ``retrieval`` and ``serve`` sections
    (:mod:`tests.reliability.kb_server_process`).
    """
    import os
    import subprocess
    import sys

    project = Path(__file__).parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(project), *sys.path])}
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.reliability.kb_server_process"]
        + [str(checkpoint), str(root), settings],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=project,
    )
    assert server.stdout is not None
    line = server.stdout.readline()
    assert line.startswith("port "), line
    return server, f"http://127.0.0.1:{int(line.split()[1])}"
