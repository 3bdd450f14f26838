"""The knowledge base on a real Chroma server (`chroma run` on loopback), shared by processes."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
import urllib.request
from importlib import resources
from pathlib import Path

import pytest

from adarag import AdaRagConfig
from adarag.cli import main
from adarag.errors import KnowledgeBaseError
from adarag.retrievers import KnowledgeBase
from adarag.schema import GenerationParams
from tests.integration.conftest import LOTHAIR_QUESTION

pytestmark = pytest.mark.integration
SERVER_START_S = 60.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _is_alive(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/api/v2/heartbeat", timeout=1.0) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def chroma_url(tmp_path_factory):
    """A Chroma server of its own, started before and stopped after this module's tests."""
    executable = Path(sys.executable).parent / "chroma"
    assert executable.is_file(), f"the chromadb package's `chroma` command is missing: {executable}"
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    directory = tmp_path_factory.mktemp("chroma-server")
    log = (directory.parent / f"chroma-server-{port}.log").open("w")
    server = subprocess.Popen(
        [
            str(executable),
            "run",
            "--path",
            str(directory),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + SERVER_START_S
        while not _is_alive(url):
            assert server.poll() is None, (
                f"chroma run exited with {server.returncode}; see {log.name}"
            )
            assert time.monotonic() < deadline, f"no heartbeat from {url} in {SERVER_START_S} s"
            time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def _passages(start: int, stop: int) -> list[str]:
    lines = resources.files("adarag.data").joinpath("demo_corpus.jsonl").read_text().splitlines()
    return lines[start:stop]


def test_ingest_and_query_through_the_server(kb_config, shared_rag, corpus_path, chroma_url):
    config = AdaRagConfig.build(
        kb_config,
        retrieval={"chroma_directory": None, "chroma_url": chroma_url, "collection": "served"},
    )
    rag = shared_rag.with_config()
    with KnowledgeBase(config.retrieval) as kb:
        assert kb.directory is None  # no directory, so no lock
        rag.retriever = kb
        report = kb.ingest([corpus_path], tokenizer=rag.tokenizer)
        assert len(report.added) == kb.count() > 0
        answer = rag.query(LOTHAIR_QUESTION, params=GenerationParams(max_new_tokens=4))
        assert answer.chunks[0].metadata["title"] == "Lothair II"
        assert answer.text and answer.trace.num_prompt_tokens > 0
    with KnowledgeBase(config.retrieval, create=False) as reader:  # a second client sees it all
        assert reader.count() == len(report.added)


INGEST_AND_QUERY = """
import json, sys, time
from transformers import AutoTokenizer
from adarag.config import RetrievalConfig
from adarag.retrievers import KnowledgeBase
url, model_dir, own_file, other_file = sys.argv[1:5]
config = RetrievalConfig(chroma_url=url, collection="shared", min_top_score=None)
kb = KnowledgeBase(config)
report = kb.ingest([own_file], tokenizer=AutoTokenizer.from_pretrained(model_dir))
deadline = time.monotonic() + 120
while time.monotonic() < deadline:  # until the other process has stored its whole file
    metadatas = kb.collection.get(where={"source": other_file}, include=["metadatas"])["metadatas"]
    if metadatas and len(metadatas) == metadatas[0]["file_num_chunks"]:
        break
    time.sleep(0.1)
found = []
for line in open(other_file):
    passage = json.loads(line)
    best = kb.retrieve(passage["title"] + "\\n" + passage["text"][:200], 1)[0]
    found.append([best.metadata["source"], best.metadata["title"], passage["title"]])
print(json.dumps({"added": [c.chunk_id for c in report.added], "found": found}))
"""


def test_two_processes_share_the_server_without_loss_or_duplicates(
    real_config, chroma_url, tmp_path
):
    files = [tmp_path / "first.jsonl", tmp_path / "second.jsonl"]
    files[0].write_text("\n".join(_passages(0, 12)) + "\n")
    files[1].write_text("\n".join(_passages(12, 24)) + "\n")
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", INGEST_AND_QUERY, chroma_url, real_config.engine.model]
            + [str(own), str(other)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for own, other in [(files[0], files[1]), (files[1], files[0])]
    ]
    results = []
    for worker in workers:
        out, err = worker.communicate(timeout=300)
        assert worker.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    config = AdaRagConfig.build(real_config, retrieval={"chroma_url": chroma_url})
    with KnowledgeBase(config.retrieval.model_copy(update={"collection": "shared"})) as kb:
        stored = kb.collection.get(include=["metadatas"])
    ids = stored["ids"]
    assert len(ids) == len(set(ids))  # each chunk exactly once
    added = [set(result["added"]) for result in results]
    assert not added[0] & added[1] and added[0] | added[1] == set(ids)
    for path in files:  # every chunk of each file, each in its place
        of_file = [m for m in stored["metadatas"] if m["source"] == str(path)]
        indices = sorted(m["chunk_idx"] for m in of_file)
        assert len(of_file) >= 12 and indices == list(range(of_file[0]["file_num_chunks"]))
    for result, other in zip(results, [files[1], files[0]], strict=True):
        assert len(result["found"]) == 12  # each process retrieves the other's chunks
        for source, title, expected_title in result["found"]:
            assert (source, title) == (str(other), expected_title)


def test_unreachable_server_is_one_clear_error(tmp_path):
    url = f"http://127.0.0.1:{_free_port()}"
    config = AdaRagConfig.build(home=tmp_path, retrieval={"chroma_url": url})
    with pytest.raises(KnowledgeBaseError, match=rf"no Chroma server answers at {url}.*chroma run"):
        KnowledgeBase.from_config(config)


def test_cli_ingests_and_answers_through_the_server(
    real_config, corpus_path, chroma_url, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("ADARAG_HOME", str(tmp_path / "home"))
    common = [
        "--chroma-url",
        chroma_url,
        "--collection",
        "cli",
        "--model",
        real_config.engine.model,
    ]
    assert main(["ingest", str(corpus_path), "--no-warm", *common]) == 0
    assert "chunks added" in capsys.readouterr().out
    assert main(["ask", LOTHAIR_QUESTION, "--max-new-tokens", "4", *common]) == 0
    assert re.search(rf"source 1: \[0\.\d+\] .*{corpus_path.name}", capsys.readouterr().out)
    both = ["--chroma-dir", str(tmp_path / "chroma")]
    assert main(["ask", LOTHAIR_QUESTION, *both, *common]) == 2
    assert "are both set" in capsys.readouterr().err
    down = [arg if arg != chroma_url else f"http://127.0.0.1:{_free_port()}" for arg in common]
    assert main(["ask", LOTHAIR_QUESTION, *down]) == 2
    err = capsys.readouterr().err
    assert "no Chroma server answers at http://127.0.0.1:" in err and "chroma run --path" in err
