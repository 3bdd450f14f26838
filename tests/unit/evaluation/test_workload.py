"""Benchmark questions: open-domain 2WikiMultihopQA and the gold-context set from its corpus."""

from __future__ import annotations

import json

from adarag.evaluation.workload import load_questions


def _write_data(tmp_path):
    corpus = [
        {"id": f"p{i}", "title": f"Title {i}", "text": f"text of passage {i}"} for i in range(20)
    ]
    rows = [
        {
            "id": "a",
            "question": "who?",
            "answers": ["x"],
            "type": "comparison",
            "gold_titles": ["Title 3", "Title 7"],
        },
        {
            "id": "b",
            "question": "what?",
            "answers": ["y"],
            "type": "inference",
            "gold_titles": ["Nowhere"],
        },
        {
            "id": "c",
            "question": "which passage is 11?",
            "answers": ["z"],
            "type": "compositional",
            "gold_titles": ["Title 11"],
        },
    ]
    (tmp_path / "2wikimqa_corpus.jsonl").write_text("\n".join(map(json.dumps, corpus)) + "\n")
    (tmp_path / "2wikimqa_dev.jsonl").write_text("\n".join(map(json.dumps, rows)) + "\n")


def test_gold_context_holds_the_gold_passages_and_distractors_shuffled(tmp_path):
    _write_data(tmp_path)
    questions = load_questions("2wikimqa-gold", tmp_path, limit=5, top_k=6)
    assert [q.qid for q in questions] == ["a", "c"]  # b has no gold passage in the corpus
    first = questions[0]
    assert first.qtype == "comparison"
    assert len(first.chunks) == 6 == len(set(first.chunks))
    assert {"Title 3\ntext of passage 3", "Title 7\ntext of passage 7"} <= set(first.chunks)
    assert load_questions("2wikimqa-gold", tmp_path, limit=5, top_k=6) == questions  # seeded


def test_open_domain_2wikimqa_retrieves_from_the_corpus_by_default(tmp_path):
    _write_data(tmp_path)
    (question,) = load_questions("2wikimqa", tmp_path, limit=1, top_k=1, offset=2)
    assert question.qid == "c" and question.chunks == ("Title 11\ntext of passage 11",)
