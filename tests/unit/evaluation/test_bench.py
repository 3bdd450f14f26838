"""The benchmark harness: the query stream, and a tiny end-to-end ``adarag bench`` run."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from adarag.cli import main
from adarag.evaluation.harness import QueryRecord
from adarag.evaluation.report import by_question_type, summarize
from adarag.evaluation.workload import query_stream
from tests.unit.engine.helpers import CHUNKS


def test_stream_asks_every_question_once_before_power_law_repeats():
    stream = query_stream(num_questions=10, num_queries=400, zipf_s=1.1, seed=3)
    first = stream[:10]
    assert sorted(item.question_idx for item in first) == list(range(10))
    assert not any(item.is_repeat for item in first)
    assert all(item.is_repeat for item in stream[10:])
    counts = Counter(item.question_idx for item in stream[10:])
    frequencies = sorted(counts.values(), reverse=True)
    assert frequencies[0] > 3 * frequencies[-1]  # a head of popular questions, a long tail
    assert query_stream(10, 400, 1.1, seed=3) == stream


def test_tiny_bench_run_writes_tables_json_and_plots(tiny_checkpoints, tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    rows = [
        {
            "id": "q1",
            "question": "what is the capital of france?",
            "answers": ["paris"],
            "passages": [{"title": "", "text": text} for text in CHUNKS],
        },
        {
            "id": "q2",
            "question": "what runs through berlin?",
            "answers": ["the spree"],
            "passages": [{"title": "", "text": text} for text in reversed(CHUNKS)],
        },
    ]
    (data_dir / "hotpotqa_dev.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    config = _tiny_config_file(tiny_checkpoints, tmp_path)
    out = tmp_path / "out"
    status = main(
        [
            "--config",
            str(config),
            "bench",
            "--dataset",
            "hotpotqa",
            "--data-dir",
            str(data_dir),
            "--limit",
            "2",
            "--queries",
            "3",
            "--top-k",
            "2",
            "--top-k-sweep",
            "1",
            "--policies",
            "full",
            "prefix",
            "cacheblend",
            "adacache-confidence",
            "--max-new-tokens",
            "2",
            "--output",
            str(out),
        ]
    )
    assert status == 0
    payload = json.loads((out / "hotpotqa.json").read_text())
    names = [s["policy"] for s in payload["summaries"]]
    assert names == ["full", "prefix", "cacheblend", "adacache-confidence"]
    for summary in payload["summaries"]:
        assert summary["num_queries"] == 3
        assert summary["ttft"]["mean"] > 0
    full = payload["summaries"][0]
    assert full["agreement_f1"] == 100.0 and full["recomputed_ratio"] == 1.0
    adacache = payload["summaries"][3]
    assert adacache["mean_chunks_used"] == 1.0  # τ = 0: the first step is confident
    assert set(payload["top_k_sweep"]) == {"1", "2"}
    plots = ("hotpotqa_ttft_vs_f1.png", "hotpotqa_depths.png", "hotpotqa_ttft_vs_topk.png")
    for name in ("hotpotqa.md", *plots):
        assert (out / name).stat().st_size > 0
    table = (out / "hotpotqa.md").read_text()
    for name in ("hotpotqa.md", *plots):
        (out / name).unlink()
    # --report-only: the same table and plots again from the JSON, no model (no --config)
    assert main(["bench", "--dataset", "hotpotqa", "--report-only", "--output", str(out)]) == 0
    assert (out / "hotpotqa.md").read_text() == table
    assert all((out / name).stat().st_size > 0 for name in plots)


def test_workload_run_puts_every_policy_beside_full_and_report_only_rewrites_it(
    data_dir, tiny_checkpoints, tmp_path
):
    config = _tiny_config_file(tiny_checkpoints, tmp_path)
    out = tmp_path / "out"
    argv = ["--config", str(config), "bench", "--workload", "multi-turn", "--output", str(out)]
    options = ["--data-dir", str(data_dir), "--limit", "4", "--top-k", "3"]
    options += ["--policies", "cacheblend", "--max-new-tokens", "2"]
    assert main([*argv, *options]) == 0
    (report,) = out.glob("multi-turn_*.json")
    rows = {row["policy"]: row for row in json.loads(report.read_text())["rows"]}
    assert list(rows) == ["full", "cacheblend"]  # the reference runs first
    assert rows["full"]["exact_agreement"] == 100.0
    assert rows["full"]["first_token_kl"] == pytest.approx(0.0, abs=1e-6)
    assert rows["cacheblend"]["num_queries"] == rows["full"]["num_queries"] >= 4
    table, plot = report.with_suffix(".md"), report.with_suffix(".png")
    expected = table.read_text()
    table.unlink()
    plot.unlink()
    assert main(["bench", "--workload", "multi-turn", "--report-only", "--output", str(out)]) == 0
    assert table.read_text() == expected and plot.stat().st_size > 0


def test_report_only_without_an_earlier_run_says_so(tmp_path, capsys):
    assert main(["bench", "--workload", "musique", "--report-only", "--output", str(tmp_path)]) == 2
    assert "no earlier run of musique" in capsys.readouterr().err


def _tiny_config_file(tiny_checkpoints, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "home": str(tmp_path / "home"),
                "engine": {"model": str(tiny_checkpoints["llama"])},
                "augment": {"num_lens_layers": 2, "threshold": 0.0},
            }
        )
    )
    return config


def _record(policy, qid, answer, chunks, qtype="comparison", f1=0.5):
    return QueryRecord(
        policy=policy,
        qid=qid,
        is_repeat=False,
        top_k=4,
        ttft_s=0.1,
        num_prompt_tokens=100,
        num_processed_tokens=50,
        num_recomputed_tokens=10,
        num_chunks_used=chunks,
        stop_reason="confident" if chunks < 4 else "exhausted",
        tier_hits={},
        confidence_s=0.0,
        prefill_s=0.1,
        answer=answer,
        f1=f1,
        exact_match=0.0,
        store_memory_bytes=0,
        qtype=qtype,
    )


def test_stopped_wrong_counts_early_stops_whose_answer_differs_from_static_top_k():
    records = [
        _record("static", "a", "paris", 4),
        _record("static", "b", "berlin", 4),
        _record("static", "c", "rome", 4, qtype="bridge"),
        _record("adaptive", "a", "Paris.", 1),  # early, same normalised answer
        _record("adaptive", "b", "bonn", 2),  # early, different: stopped wrong
        _record("adaptive", "c", "milan", 4, qtype="bridge", f1=0.0),  # not early
    ]
    summaries = {s.policy: s for s in summarize(records, {"adaptive": "static"})}
    adaptive = summaries["adaptive"]
    assert adaptive.static_agreement == pytest.approx(100 / 3)
    assert adaptive.stopped_wrong == pytest.approx(50.0)
    assert summaries["static"].stopped_wrong is None
    types = {row[0]: row for row in by_question_type(records, "adaptive", "static")}
    assert types["comparison"][1:4] == (2, 50.0, 1.5)
    assert types["bridge"][2] == 100.0 and types["bridge"][4] == 0.0
