"""A LlamaIndex app whose query engine is adarag's AdaptiveCachedQueryEngine.

Builds a VectorStoreIndex over bundled 2WikiMultihopQA passages with the offline MiniLM
embedding, then answers through the adaptive, cache-accelerated engine: once whole, once
streamed, with the sources and the augmentation trace LlamaIndex hands back.

    .venv/bin/python examples/llama_index_app.py
"""

from __future__ import annotations

from llama_index.core import Document, VectorStoreIndex
from llama_index.packs.adarag import AdaptiveCachedQueryEngine, AdaRagEmbedding

from adarag import AdaRAG
from adarag.data import demo_corpus

QUESTIONS = [
    "When did Lothair Ii's mother die?",
    "Which film was released first, Aas Ka Panchhi or Phoolwari?",
]


def main() -> None:
    documents = [
        Document(text=chunk.text, doc_id=chunk.chunk_id, metadata=chunk.metadata)
        for chunk in demo_corpus()[:40]
    ]
    index = VectorStoreIndex.from_documents(documents, embed_model=AdaRagEmbedding())
    rag = AdaRAG()  # the local model, loaded once
    engine = AdaptiveCachedQueryEngine.from_index(index, rag, similarity_top_k=3, max_new_tokens=32)

    response = engine.query(QUESTIONS[0])
    print(f"Q: {QUESTIONS[0]}\nA: {response}")
    for node in response.source_nodes:
        print(f"   source [{node.score:.2f}] {node.node.metadata['title']}")
    trace = response.metadata["adarag"]
    print(f"   TTFT {trace['ttft_s']:.2f} s, tiers {trace['steps'][-1]['tiers']}")
    print(f"   usage {trace['usage']}")

    streaming = AdaptiveCachedQueryEngine.from_index(
        index, rag, similarity_top_k=3, max_new_tokens=32, streaming=True
    )
    response = streaming.query(QUESTIONS[1])
    print(f"\nQ: {QUESTIONS[1]}\nA: ", end="")
    for token in response.response_gen:
        print(token, end="", flush=True)
    print(f"\n   sources: {[n.node.metadata['title'] for n in response.source_nodes]}")


if __name__ == "__main__":
    main()
