"""A small 2Wiki-shaped data set, for the workloads and the commands that run them."""

from __future__ import annotations

import json

import pytest

ENTITIES = [f"person{n}" for n in range(12)]


@pytest.fixture()
def data_dir(tmp_path):
    """A small 2Wiki-shaped data set: questions about pairs of entities, and a corpus."""
    corpus = [
        {"id": f"e{n}", "title": name, "text": f"{name} was born in town{n} and wrote book{n}."}
        for n, name in enumerate(ENTITIES)
    ]
    corpus += [
        {"id": f"f{n}", "title": f"filler{n}", "text": f"filler passage {n} about weather {n}."}
        for n in range(200)
    ]
    rows = []
    for n in range(0, 12, 3):  # chains: (n, n+1), (n+1, n+2) share entity n+1
        a, b, c = ENTITIES[n], ENTITIES[n + 1], ENTITIES[n + 2]
        rows.append(_row(f"q{n}a", f"Who is older, {a} or {b}?", [a, b]))
        rows.append(_row(f"q{n}b", f"Where was {b} born, and {c}?", [b, c]))
    rows.append(_row("lonely", "Where was person0 born?", ["nobody"]))
    (tmp_path / "2wikimqa_dev.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (tmp_path / "2wikimqa_corpus.jsonl").write_text("\n".join(json.dumps(r) for r in corpus))
    return tmp_path


def _row(qid, question, titles):
    return {
        "id": qid,
        "question": question,
        "answers": ["x"],
        "type": "comparison",
        "gold_titles": titles,
    }
