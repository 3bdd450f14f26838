"""A LangChain LCEL chain around adarag's AdaptiveCachedRAG Runnable.

The knowledge base is an embedded Chroma collection (in a temporary directory here); the chain
normalises the question, answers with cache-accelerated RAG, and streams the answer deltas.

    .venv/bin/python examples/langchain_lcel.py
"""

from __future__ import annotations

import tempfile

from langchain_adarag import AdaptiveCachedRAG
from langchain_core.runnables import RunnableLambda

from adarag import AdaRAG, AdaRagConfig, Chunk
from adarag.data import demo_corpus
from adarag.retrievers import KnowledgeBase


def sources(output: dict) -> list[str]:
    return [f"[{doc.metadata['score']:.2f}] {doc.metadata['title']}" for doc in output["context"]]


def main() -> None:
    with tempfile.TemporaryDirectory() as directory:
        config = AdaRagConfig.build(retrieval={"chroma_directory": directory, "top_k": 3})
        with KnowledgeBase.from_config(config) as kb:
            kb.add_chunks([Chunk(c.text, metadata=c.metadata) for c in demo_corpus()[:40]])
            rag = AdaRAG(config, retriever=kb)
            chain = RunnableLambda(lambda q: {"input": q.strip()}) | AdaptiveCachedRAG(
                rag=rag, max_new_tokens=32
            )

            question = "  When did Lothair Ii's mother die? "
            print(f"Q: {question.strip()}\nA: ", end="")
            final: dict = {}
            for chunk in chain.stream(question):
                print(chunk.get("answer", ""), end="", flush=True)
                final = {**final, **{k: v for k, v in chunk.items() if k != "answer"}}
            print(f"\n   sources: {sources(final)}")
            print(f"   stop: {final['stop_reason']}, usage: {final['usage_metadata']}")

            answers = (chain | RunnableLambda(lambda out: out["answer"])).batch(
                [
                    "Who produced Aas Ka Panchhi?",
                    "Which film was released first, Aas Ka Panchhi or Phoolwari?",
                ]
            )
            print("\n".join(f"batch answer: {answer}" for answer in answers))


if __name__ == "__main__":
    main()
