"""A knowledge-base chatbot: files into an embedded Chroma, then a multi-turn chat over them.

Ingests passages (unchanged files are skipped on the next run; new chunks' KV is
precomputed), then answers a scripted conversation -- or your own with --interactive -- showing
each answer's sources, time to first token and cache tiers.

    .venv/bin/python examples/chroma_chatbot.py [--interactive]
"""

from __future__ import annotations

import sys
import tempfile
from collections import Counter
from importlib import resources
from pathlib import Path

from adarag import AdaRAG, AdaRagConfig, GenerationParams
from adarag.conversation import Conversation
from adarag.retrievers import KnowledgeBase

SCRIPT = ["Who was the mother of Lothair II?", "When did she die?"]
PARAMS = GenerationParams(max_new_tokens=32)


def main() -> None:
    interactive = "--interactive" in sys.argv
    turns = iter(lambda: input("you> "), "exit") if interactive else iter(SCRIPT)
    with tempfile.TemporaryDirectory() as directory:
        config = AdaRagConfig.build(retrieval={"chroma_directory": directory, "top_k": 3})
        with KnowledgeBase.from_config(config) as kb:
            rag = AdaRAG(config, retriever=kb)
            # Your files go here: text, markdown, or JSONL passages (a slice of the bundled ones).
            corpus = resources.files("adarag.data").joinpath("demo_corpus.jsonl").read_text()
            passages = Path(directory) / "passages.jsonl"
            passages.write_text("\n".join(corpus.splitlines()[:40]))
            report = kb.ingest([passages], tokenizer=rag.tokenizer)
            print(f"ingested {len(report.added)} chunks; warming their KV...")
            rag.warm(report.added)

            conversation = Conversation()
            for message in turns:
                print(f"you> {message}" if not interactive else "", end="\nbot> ")
                stream = rag.stream(message, history=conversation.history(), params=PARAMS)
                for delta in stream:
                    print(delta, end="", flush=True)
                answer = stream.answer()
                tiers = Counter(answer.trace.steps[-1].tiers) if answer.trace.steps else {}
                print(f"\n     TTFT {answer.trace.ttft_s:.2f} s | tiers {dict(tiers)}")
                for chunk in answer.chunks:
                    print(f"     source [{chunk.score:.2f}] {chunk.metadata.get('title')}")
                conversation.add_turn(message, answer.text, grounded=bool(answer.chunks))


if __name__ == "__main__":
    main()
