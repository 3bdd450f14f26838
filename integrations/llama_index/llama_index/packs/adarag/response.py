"""What a response carries: the nodes used, the augmentation trace, token usage, and events."""

from __future__ import annotations

from typing import Any

import llama_index.core.instrumentation as instrument
from llama_index.core.schema import MetadataMode, NodeWithScore
from llama_index.packs.adarag.events import AdaptiveStepEvent, AdaptiveStopEvent

from adarag import Answer, AnswerStream, Chunk
from adarag.pipeline import CITATION_KEY
from adarag.schema import QueryTrace

dispatcher = instrument.get_dispatcher(__name__)

METADATA_KEY = "adarag"


def describe(
    stream: AnswerStream, nodes: list[NodeWithScore]
) -> tuple[list[NodeWithScore], dict[str, Any]]:
    """The nodes used, the response metadata, and the trace events (before any token)."""
    by_id = {node.node_id: node for node in nodes}
    used = [_numbered(by_id[str(chunk.chunk_id)], chunk) for chunk in stream.chunks]
    used_ids = [node.node_id for node in used]
    unused_ids = [node.node_id for node in nodes if node.node_id not in set(used_ids)]
    trace = stream.trace
    for step_idx, step in enumerate(trace.steps):
        dispatcher.event(
            AdaptiveStepEvent(
                step_idx=step_idx,
                num_chunks=step.num_chunks,
                node_ids=used_ids[: step.num_chunks],
                confidence=step.confidence,
                tiers=list(step.tiers),
                num_recomputed_tokens=step.num_recomputed_tokens,
                prefill_s=step.prefill_s,
            )
        )
    confidence = trace.steps[-1].confidence if trace.steps else None
    dispatcher.event(
        AdaptiveStopEvent(
            stop_reason=trace.stop_reason,
            node_ids=used_ids,
            unused_node_ids=unused_ids,
            confidence=confidence,
            ttft_s=trace.ttft_s,
            recomputed_ratio=trace.recomputed_ratio,
        )
    )
    metadata: dict[str, Any] = {node.node_id: node.metadata for node in used}
    metadata[METADATA_KEY] = _trace_metadata(trace, unused_ids)
    return used, metadata


def _numbered(node: NodeWithScore, chunk: Chunk) -> NodeWithScore:
    """``node``, with a copy of its node holding the chunk's citation number when it has one."""
    number = chunk.metadata.get(CITATION_KEY)
    if number is None:
        return node
    metadata = {**node.node.metadata, CITATION_KEY: number}
    return NodeWithScore(node=node.node.model_copy(update={"metadata": metadata}), score=node.score)


def token_usage(answer: Answer) -> dict[str, int]:
    """Prompt, completion and cached tokens (``cached``: prompt KV taken from the cache)."""
    return {
        "prompt_tokens": answer.trace.num_prompt_tokens,
        "completion_tokens": answer.num_completion_tokens,
        "cached_tokens": answer.num_cached_tokens,
        "total_tokens": answer.trace.num_prompt_tokens + answer.num_completion_tokens,
    }


def chunks_from_nodes(nodes: list[NodeWithScore]) -> list[Chunk]:
    """Nodes as adarag chunks (text as the LLM sees it; ids kept to map answers back)."""
    return [
        Chunk(
            node.node.get_content(metadata_mode=MetadataMode.LLM),
            chunk_id=node.node_id,
            score=node.score,
            metadata=dict(node.node.metadata),
        )
        for node in nodes
        if node.node.get_content(metadata_mode=MetadataMode.LLM).strip()
    ]


def _trace_metadata(trace: QueryTrace, unused_ids: list[str]) -> dict[str, Any]:
    steps = [
        {
            "num_chunks": step.num_chunks,
            "confidence": step.confidence,
            "kl_score": step.kl_score,
            "entropy_score": step.entropy_score,
            "tiers": list(step.tiers),
            "num_processed_tokens": step.num_processed_tokens,
            "num_recomputed_tokens": step.num_recomputed_tokens,
            "prefill_s": step.prefill_s,
            "confidence_s": step.confidence_s,
        }
        for step in trace.steps
    ]
    return {
        "stop_reason": trace.stop_reason,
        "confidence": steps[-1]["confidence"] if steps else None,
        "num_chunks_used": trace.num_chunks_used,
        "num_dropped_chunks": trace.num_dropped_chunks,
        "unused_node_ids": unused_ids,
        "steps": steps,
        "ttft_s": trace.ttft_s,
        "retrieval_s": trace.retrieval_s,
        "recomputed_ratio": trace.recomputed_ratio,
        "usage": None,  # filled when the answer is complete
    }
