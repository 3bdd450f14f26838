"""The fidelity run on a tiny model: full recomputation agrees with itself, controls differ."""

from __future__ import annotations

import pytest
import torch

from adarag import AdaRAG
from adarag.cache.keys import fused_key
from adarag.config import FusionConfig, RecomputeConfig
from adarag.engine.prefill_request import PrefillRequest
from adarag.errors import InputError
from adarag.evaluation.fidelity import (
    FidelityRun,
    FidelitySummary,
    Target,
    first_token_kl,
    matched_speedup,
    smallest_ratio_meeting,
    summarize,
)
from adarag.evaluation.reuse import independent_chunks, reuse_sources
from adarag.evaluation.workload import BenchQuestion
from adarag.pipeline.learned import learned_controls
from adarag.retrievers.memory import MemoryRetriever
from adarag.schema import Chunk, GenerationParams
from tests.unit.engine.helpers import CHUNKS, QUESTION
from tests.unit.pipeline.packet_profile import with_packet


@pytest.fixture()
def rows(tiny_checkpoints, tiny_config):
    rag = AdaRAG(tiny_config(tiny_checkpoints["llama"]))
    rules = {
        "cross_attention": RecomputeConfig(),
        "oracle": RecomputeConfig(selection_policy="oracle"),
    }
    run = FidelityRun(rag, rules, [0.0, 0.5, 1.0], GenerationParams(max_new_tokens=6))
    item = BenchQuestion("q1", QUESTION, ("paris",), CHUNKS)
    return run.question("tiny", item)


def test_ratio_one_reproduces_the_reference_and_ratio_zero_is_shared(rows):
    by_key = {(row.rule, row.ratio): row for row in rows}
    assert len(rows) == 6
    for rule in ("cross_attention", "oracle"):
        exact = by_key[(rule, 1.0)]
        assert exact.answer == exact.reference and exact.exact_agreement == 1.0
        assert exact.first_token_kl == pytest.approx(0.0, abs=1e-6)
    assert by_key[("cross_attention", 0.0)].answer == by_key[("oracle", 0.0)].answer
    recomputed = {row.ratio: row.num_recomputed_tokens for row in rows if row.rule == "oracle"}
    assert recomputed[0.0] < recomputed[0.5] < recomputed[1.0]


def test_summaries_and_the_smallest_ratio_meeting_a_target(rows):
    summaries = summarize(rows)
    assert [(s.rule, s.ratio) for s in summaries][:2] == [("cross_attention", 0.0), ("oracle", 0.0)]
    loose = Target(min_exact_agreement=0.0, min_gold_f1_share=0.0)
    assert smallest_ratio_meeting(summaries, "oracle", loose).ratio == 0.0
    strict = Target(min_exact_agreement=100.0, min_gold_f1_share=0.0)
    hit = smallest_ratio_meeting(summaries, "oracle", strict)
    assert hit is not None and hit.exact_agreement == 100.0


def _point(rule: str, ratio: float, speedup: float, exact: float) -> FidelitySummary:
    zeros = dict.fromkeys(
        ("f1_agreement", "first_token_agreement", "first_token_kl", "gold_em", "gold_f1"), 0.0
    )
    return FidelitySummary(
        rule, ratio, 10, exact, **zeros, gold_contains=0.0, reference_gold_f1=0.0,
        ttft_s=1.0 / speedup, full_ttft_s=1.0,
    )  # fmt: skip


def test_matched_speedup_interpolates_between_a_rules_ratios():
    curve = [_point("a", 0.05, 4.0, 40.0), _point("a", 0.1, 3.0, 50.0), _point("a", 0.2, 2.0, 70.0)]
    middle = matched_speedup(curve, "a", 60.0, "exact_agreement")
    # halfway in agreement is halfway in cost: (1/3 + 1/2) / 2 of full's TTFT
    assert middle is not None and middle.speedup == pytest.approx(2.4) and not middle.at_fastest
    on_point = matched_speedup(curve, "a", 50.0, "exact_agreement")
    assert on_point is not None and on_point.speedup == pytest.approx(3.0)
    easy = matched_speedup(curve, "a", 30.0, "exact_agreement")
    assert easy is not None and easy.speedup == pytest.approx(4.0) and easy.at_fastest
    assert matched_speedup(curve, "a", 80.0, "exact_agreement") is None
    assert matched_speedup(curve, "b", 10.0, "exact_agreement") is None


def test_rows_resume_from_their_file_and_a_torn_last_line_is_measured_again(rows, tmp_path):
    from adarag.evaluation.fidelity import append_rows, read_rows

    path = tmp_path / "tiny.rows.jsonl"
    append_rows(path, rows[:3])
    append_rows(path, rows[3:])
    assert read_rows(path) == rows
    with path.open("a") as handle:
        handle.write('{"dataset": "tiny", "qid": "q2", "ru')  # a run killed mid-write
    assert read_rows(path) == rows
    assert read_rows(tmp_path / "missing.jsonl") == []


def test_done_rows_are_not_measured_again(tiny_checkpoints, tiny_config):
    rag = AdaRAG(tiny_config(tiny_checkpoints["llama"]))
    run = FidelityRun(
        rag, {"kv": RecomputeConfig()}, [0.0, 0.5], GenerationParams(max_new_tokens=4)
    )
    item = BenchQuestion("q1", QUESTION, ("paris",), CHUNKS)
    rest = run.question("tiny", item, done={("kv", 0.0)})
    assert [(row.rule, row.ratio) for row in rest] == [("kv", 0.5)]


def test_fused_rows_reuse_the_entries_warming_stores(tiny_checkpoints, tiny_config):
    corpus = [*CHUNKS, "the lazy dog sleeps by the quick river in paris."]
    knowledge_base = MemoryRetriever([Chunk(text) for text in corpus])
    cache = {"store": {"storage_dtype": "float32"}}
    fusion = {"fusion": {"enabled": True, "num_neighbors": 2}}
    config = tiny_config(tiny_checkpoints["llama"], cache=cache, experimental=fusion)
    rag = AdaRAG(config, retriever=knowledge_base)
    rules = {"kv": RecomputeConfig(selection_policy="kv_deviation")}
    params = GenerationParams(max_new_tokens=4)
    item = BenchQuestion("q1", QUESTION, ("paris",), CHUNKS)
    fusion = FusionConfig(num_neighbors=2)
    fused = FidelityRun(rag, rules, [0.0, 1.0], params, ("float32",), knowledge_base, fusion)
    alone = FidelityRun(rag, rules, [0.0, 1.0], params)
    fused_rows = {(row.rule, row.ratio): row for row in fused.question("tiny", item)}
    alone_rows = {(row.rule, row.ratio): row for row in alone.question("tiny", item)}
    assert set(fused_rows) == {("kv+fused2", 0.0), ("kv+fused2", 1.0)}
    assert fused_rows[("kv+fused2", 1.0)].first_token_kl == pytest.approx(0.0, abs=1e-6)
    reused_kl = (
        fused_rows[("kv+fused2", 0.0)].first_token_kl,
        alone_rows[("kv", 0.0)].first_token_kl,
    )
    assert abs(reused_kl[0] - reused_kl[1]) > 1e-6  # the fused entries are other KV
    # the entries the rows reuse are the ones warming a knowledge base stores
    rag.warm(corpus)
    layout = rag.layout(QUESTION, CHUNKS)
    system_kv, independent = independent_chunks(rag.engine, layout)
    entries = fused.fused_chunks(layout, item, system_kv, independent)
    for ids, kv in zip(layout.chunk_ids, entries, strict=True):
        stored = rag.cache.store.get(fused_key(rag.cache.root, rag.cache.keys([ids]).chunks[0]))
        assert stored is not None and stored.start_position == kv.start_position
        torch.testing.assert_close(stored.k, kv.k, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(stored.v, kv.v, atol=1e-5, rtol=1e-5)


def test_a_trailer_rule_reuses_entries_closed_by_its_trailer(tiny_checkpoints, tiny_config):
    rag = AdaRAG(tiny_config(tiny_checkpoints["llama"]))
    with_packet(rag, rows=0, trailer=2)
    rag = AdaRAG(rag.config)  # reads the profile with the trailer
    rules = {"off": RecomputeConfig(packet="off"), "trailer": RecomputeConfig(packet="on")}
    params = GenerationParams(max_new_tokens=4)
    run = FidelityRun(rag, rules, [0.0], params)
    item = BenchQuestion("q1", QUESTION, ("paris",), CHUNKS)
    by_rule = {row.rule: row for row in run.question("tiny", item)}
    assert by_rule["off"].first_token_kl != pytest.approx(by_rule["trailer"].first_token_kl)

    # the same prompt prefilled by hand from entries each closed by the trailer
    engine = rag.engine
    controls = learned_controls(rules["trailer"], rag.profile)
    layout = rag.layout(QUESTION, CHUNKS, params)
    full = engine.prefill(PrefillRequest(layout))
    trailed = layout.with_trailers(controls.trailer_ids(engine.spec.vocab_size))
    system_kv, _ = independent_chunks(engine, layout)
    entries = [
        engine.compute_chunk(trailed.system_ids, ids, system_kv, packet=controls.packet)
        for ids in trailed.chunk_ids
    ]
    reused = engine.prefill(
        PrefillRequest(trailed, reuse_sources(system_kv, entries, 0.0), controls=controls)
    )
    kl = first_token_kl(full.logits, reused.logits)
    assert by_rule["trailer"].first_token_kl == pytest.approx(kl, rel=1e-4, abs=1e-6)

    oracle = {"oracle": RecomputeConfig(selection_policy="output_oracle", packet="on")}
    with pytest.raises(InputError, match="packet=off"):
        FidelityRun(rag, oracle, [0.5], params).question("tiny", item)
