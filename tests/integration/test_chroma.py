"""The Chroma knowledge base end to end: real MiniLM embeddings, embedded Chroma, the model."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time

import pytest

from adarag import AdaRagConfig
from adarag.cli import build_parser, main
from adarag.cli.ingest import ingest_and_warm
from adarag.cli.options import build_config, open_knowledge_base
from adarag.config import RetrievalConfig
from adarag.errors import KnowledgeBaseError
from adarag.pipeline.answer_stream import NO_CONTEXT_ANSWER
from adarag.retrievers import KnowledgeBase
from adarag.schema import Chunk, GenerationParams
from tests.integration.conftest import (
    LOTHAIR_QUESTION,
    UNRELATED_QUESTION,
    assert_used_prefix_of_retrieved,
    retrieved_titles,
)
from tests.integration.loop_probe import probe

pytestmark = pytest.mark.integration
PARAMS = GenerationParams(max_new_tokens=12)


def test_answer_comes_with_the_retrieved_sources_best_first(kb_rag):
    retrieved = retrieved_titles(kb_rag, LOTHAIR_QUESTION, kb_rag.config.retrieval.top_k)
    assert retrieved[0] == "Lothair II" and "Ermengarde of Tours" in retrieved
    answer = kb_rag.query(LOTHAIR_QUESTION, params=PARAMS)
    titles = [chunk.metadata["title"] for chunk in answer.chunks]
    assert_used_prefix_of_retrieved(titles, retrieved)
    assert len(titles) == answer.trace.num_chunks_used
    scores = [chunk.score for chunk in answer.chunks]
    assert scores == sorted(scores, reverse=True) and 0 < scores[-1] <= scores[0] <= 1
    assert answer.text and answer.num_completion_tokens > 0
    assert answer.trace.ttft_s > 0 and answer.trace.num_prompt_tokens > 0


def test_chunks_are_token_sized_with_overlap(kb_config, shared_rag, tmp_path):
    config = AdaRagConfig.build(
        kb_config, retrieval={"collection": "sized", "chunk_tokens": 48, "chunk_overlap_tokens": 8}
    )
    notes = tmp_path / "notes.md"
    notes.write_text(" ".join(f"Fact {i}: the river {i} flows north." for i in range(40)))
    with KnowledgeBase(config.retrieval) as kb:
        kb.ingest([notes], tokenizer=shared_rag.tokenizer)
        chunks = sorted(kb.chunks(), key=lambda chunk: chunk.metadata["chunk_idx"])
    sizes = [len(shared_rag.tokenizer.encode(chunk.text)) for chunk in chunks]
    assert len(chunks) > 3 and max(sizes) <= 48 + 1  # +1: re-tokenising at a cut may split
    assert chunks[0].text[-10:] in chunks[1].text  # neighbours share their overlap


def test_ingest_warms_new_chunks_and_reingest_does_no_work(kb_config, shared_rag, corpus_path):
    config = AdaRagConfig.build(kb_config, retrieval={"collection": "warmed"})
    rag = shared_rag.with_config()
    with KnowledgeBase(config.retrieval) as kb:
        rag.retriever = kb
        report = ingest_and_warm(rag, kb, [corpus_path])
        assert len(report.added) == kb.count() > 0
        assert rag.warm(report.added) == 0  # every new chunk's KV is already computed
        started = time.perf_counter()
        again = ingest_and_warm(rag, kb, [corpus_path])
        assert again.added == () and again.num_files_unchanged == 1
        assert time.perf_counter() - started < 5.0  # no embedding or KV (a presence check only)
        answer = rag.query(LOTHAIR_QUESTION, params=PARAMS)
        for step in answer.trace.steps:  # warmed at ingest: nothing is computed in full, and
            assert "miss" not in step.tiers  # each step reuses the previous step's chunks as is
            assert set(step.tiers[:-1]) <= {"hard"}
        assert answer.num_cached_tokens > 0


def test_stream_yields_tokens_incrementally(kb_rag):
    stream = kb_rag.stream(LOTHAIR_QUESTION, params=PARAMS)
    assert stream.chunks and stream.trace.ttft_s > 0  # known before the first token
    deltas = list(stream)
    assert len(deltas) > 1
    assert stream.answer().text == "".join(deltas).strip()


def test_concurrent_aqueries_do_not_block_the_event_loop(kb_rag):
    result = asyncio.run(
        probe(
            kb_rag.aquery(LOTHAIR_QUESTION, params=PARAMS),
            kb_rag.aquery("Who produced Aas Ka Panchhi?", params=PARAMS),
        )
    )
    assert all(answer.text for answer in result.results)
    assert result.overlapped  # both in flight at once; engine steps serialised by the lock
    assert result.max_tick_gap_s < result.elapsed_s / 2


def test_unrelated_question_gets_the_no_context_answer(kb_rag, knowledge_base):
    before = knowledge_base.count()
    answer = kb_rag.query(UNRELATED_QUESTION, params=PARAMS)
    assert answer.text == NO_CONTEXT_ANSWER and answer.chunks == ()
    assert answer.trace.stop_reason == "no_context"
    assert knowledge_base.count() == before


def test_empty_knowledge_base_is_a_clear_error(kb_config, shared_rag):
    config = AdaRagConfig.build(kb_config, retrieval={"collection": "empty"})
    with KnowledgeBase(config.retrieval) as kb:
        rag = shared_rag.with_config()
        rag.retriever = kb
        with pytest.raises(KnowledgeBaseError, match="is empty; ingest documents first"):
            rag.query(LOTHAIR_QUESTION, params=PARAMS)


HOLDER = """
import sys, time
from adarag.config import RetrievalConfig
from adarag.retrievers import KnowledgeBase
kb = KnowledgeBase(RetrievalConfig(chroma_directory=sys.argv[1], collection="held"))
print("ready", flush=True)
time.sleep(60)
"""


def test_directory_held_by_another_process_is_refused_and_kept(tmp_path):
    config = RetrievalConfig(chroma_directory=tmp_path / "held-chroma", collection="held")
    with KnowledgeBase(config) as kb:
        kb.add_chunks([Chunk("Paris is the capital of France."), Chunk("Rome is in Italy.")])
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(config.chroma_directory)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        started = time.perf_counter()
        expected = rf"in use by another process \(pid {holder.pid}\)"
        with pytest.raises(KnowledgeBaseError, match=expected):
            KnowledgeBase(config)
        assert time.perf_counter() - started < 5.0  # refused at once, no SQLite busy wait
    finally:
        holder.kill()
        holder.wait()
    with KnowledgeBase(config) as reopened:
        assert reopened.count() == 2


def test_cli_ingest_then_chat_shows_sources_ttft_and_tiers(
    kb_config, corpus_path, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("ADARAG_HOME", str(tmp_path / "home"))  # an empty KV cache of its own
    model = str(kb_config.engine.model)
    chroma = str(tmp_path / "cli-chroma")
    common = ["--model", model, "--chroma-dir", chroma, "--collection", "cli", "--top-k", "2"]
    assert main(["ingest", str(corpus_path), "--no-warm", *common]) == 0
    assert "0 unchanged: 15 chunks added" in capsys.readouterr().out  # 3 passages are split
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO(f"{LOTHAIR_QUESTION}\nexit\n"))
    assert main(["chat", "--max-new-tokens", "8", *common]) == 0
    out = capsys.readouterr().out
    assert "TTFT" in out and "source 1: [0." in out
    tiers = re.search(r"tiers: ([a-z]+ x\d(, [a-z]+ x\d)*) \| (\d) step\(s\), stop: (\w+)", out)
    assert tiers is not None, out
    assert "miss" in tiers[1]  # not warmed (--no-warm): the last chunk added is computed in full
    assert tiers[4] in ("confident", "exhausted", "static")  # static: no calibrated agreement τ
    # one question without files: answered from the same knowledge base, sources named
    assert main(["ask", LOTHAIR_QUESTION, "--max-new-tokens", "4", *common]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"source 1: \[0\.\d+\] .*{corpus_path.name}, chunk \d+/\d+", out), out
    assert main(["ask", LOTHAIR_QUESTION, "--ratio", "0.5", *common]) == 2
    assert "--ratio and --full apply to given files" in capsys.readouterr().err


def test_cli_prune_forgets_deleted_files_and_chat_refuses_a_mistyped_collection(
    kb_config, corpus_path, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("ADARAG_HOME", str(tmp_path / "home"))
    lines = corpus_path.read_text().splitlines()
    kept, deleted = tmp_path / "kept.jsonl", tmp_path / "deleted.jsonl"
    kept.write_text(lines[0] + "\n")
    deleted.write_text(lines[1] + "\n")
    chroma = tmp_path / "cli-chroma"
    common = ["--model", str(kb_config.engine.model), "--chroma-dir", str(chroma)]
    common += ["--collection", "notes"]
    assert main(["ingest", str(kept), str(deleted), "--no-warm", *common]) == 0
    capsys.readouterr()
    deleted.unlink()
    assert main(["ingest", str(kept), "--no-warm", "--prune", *common]) == 0
    out = capsys.readouterr().out
    assert "of 1 missing file(s)" in out and str(deleted) in out
    with KnowledgeBase(RetrievalConfig(chroma_directory=chroma, collection="notes")) as kb:
        assert {c.metadata["source"] for c in kb.chunks()} == {str(kept)}

    typo = [arg if arg != "notes" else "ntoes" for arg in common]
    assert main(["chat", *typo]) == 2
    assert "no collection 'ntoes'" in capsys.readouterr().err
    with KnowledgeBase(RetrievalConfig(chroma_directory=chroma, collection="notes")) as kb:
        names = [c.name for c in kb.collection._client.list_collections()]
    assert names == ["notes"]  # the typo created nothing


def test_a_where_filter_matching_nothing_is_named_and_a_relative_source_is_resolved(
    kb_config, knowledge_base, corpus_path, monkeypatch, capsys
):
    """Regression: such a filter answered "no chunk ... is relevant enough" and exited 0."""
    common = ["--chroma-dir", str(kb_config.retrieval.chroma_directory), "--collection", "tests"]
    common += ["--model", str(kb_config.engine.model)]
    assert main(["ask", LOTHAIR_QUESTION, "--where", "title=No Such Title", *common]) == 2
    err = capsys.readouterr().err
    assert "the filter (--where title=No Such Title) matched no chunk of the" in err
    # a relative source= path names the file as ingest stored it (absolute)
    monkeypatch.chdir(corpus_path.parent)
    args = build_parser().parse_args(["ask", "q", "--where", f"source={corpus_path.name}"])
    config = build_config(args)
    assert config.retrieval.where == {"source": str(corpus_path.resolve())}
    filtered = AdaRagConfig.build(kb_config, retrieval={"where": config.retrieval.where})
    with open_knowledge_base(filtered) as kb:
        found = kb.retrieve(LOTHAIR_QUESTION, 3)
    assert found and {chunk.metadata["source"] for chunk in found} == {str(corpus_path.resolve())}
