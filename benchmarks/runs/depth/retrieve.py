"""``depth.py retrieve``: each corpus into Chroma (once), every question's top-12 to a file."""

from __future__ import annotations

import argparse
import json
import time

from common import CACHE

from adarag.evaluation.corpora import corpus_chunks, gold_titles, is_gold, questions
from runs.depth.splits import MAX_K, retrieved_path, split_rows


def retrieve(args: argparse.Namespace) -> None:
    """Embed each corpus into Chroma (once) and write every question's top-12."""
    from adarag.config import RetrievalConfig
    from adarag.retrievers import KnowledgeBase

    for dataset in args.datasets:
        path = retrieved_path(dataset, args.split)
        if path.exists():
            print(f"{path} exists")
            continue
        config = RetrievalConfig(collection=f"depth-{dataset}", chroma_directory=CACHE / "chroma")
        with KnowledgeBase(config) as kb:
            chunks = corpus_chunks(dataset, args.data_dir)
            if kb.count() < len(chunks):
                started = time.perf_counter()
                kb.add_chunks(chunks, source=dataset)
                print(
                    f"{dataset}: {len(chunks)} chunks embedded in "
                    f"{time.perf_counter() - started:.0f} s"
                )
            rows = questions(dataset, args.data_dir)
            selected = split_rows(rows, dataset, args.split, args.questions)
            lines = []
            for row in selected:
                found = kb.retrieve(row["question"], MAX_K)
                titles = gold_titles(dataset, row)
                lines.append(
                    json.dumps(
                        {
                            "qid": str(row["id"]),
                            "question": row["question"],
                            "answers": row["answers"],
                            "type": row.get("type"),
                            "num_gold": len(titles),
                            "chunks": [
                                {
                                    "id": c.chunk_id,
                                    "text": c.text,
                                    "score": c.score,
                                    "gold": is_gold(c, titles, row["answers"]),
                                }
                                for c in found
                            ],
                        }
                    )
                )
        path.write_text("\n".join(lines) + "\n")
        print(f"{dataset}: {len(lines)} questions retrieved -> {path}")
