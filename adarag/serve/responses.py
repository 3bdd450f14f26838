"""Response bodies: OpenAI's completions and stream chunks, and the RAG query's answer."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any, Literal

from adarag.schema import Answer, Chunk, GenerationParams, QueryTrace

Kind = Literal["chat", "text"]


def usage(answer: Answer) -> dict[str, Any]:
    """OpenAI's usage: prompt, completion and total tokens; prompt tokens whose KV was reused."""
    prompt_tokens = answer.trace.num_prompt_tokens
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": answer.num_completion_tokens,
        "total_tokens": prompt_tokens + answer.num_completion_tokens,
        "prompt_tokens_details": {"cached_tokens": answer.num_cached_tokens},
    }


def finish_reason(answer: Answer, params: GenerationParams) -> str:
    """``length`` when the answer used every token it was allowed, else ``stop``."""
    return "length" if answer.num_completion_tokens >= params.max_new_tokens else "stop"


def source(chunk: Chunk, *, with_text: bool) -> dict[str, Any]:
    """A chunk the answer was conditioned on: id, score, metadata (and text).

    The file an ingested chunk came from is shown by its name only: where the server keeps its
    files is not the client's business.
    """
    metadata = dict(chunk.metadata)
    if isinstance(metadata.get("source"), str):
        metadata["source"] = PurePath(metadata["source"]).name
    described: dict[str, Any] = {
        "chunk_id": chunk.chunk_id,
        "score": chunk.score,
        "metadata": metadata,
    }
    if with_text:
        described["text"] = chunk.text
    return described


def trace_summary(chunks: Sequence[Chunk], trace: QueryTrace) -> dict[str, Any]:
    """What the ``adarag`` field of an OpenAI response holds: sources and the main figures.

    Each source carries its text, so a client (the chat page) can show what the answer read.
    ``tiers``: the cache tier each chunk's KV came from, in the prompt's order (``miss``:
    computed in full).
    """
    return {
        "sources": [source(chunk, with_text=True) for chunk in chunks],
        "stop_reason": trace.stop_reason,
        "ttft_s": trace.ttft_s,
        "num_chunks_used": trace.num_chunks_used,
        "tiers": list(trace.steps[-1].tiers) if trace.steps else [],
    }


def rag_answer(answer: Answer, model: str) -> dict[str, Any]:
    """The body of ``POST /v1/rag/query``: answer, sources with text, full trace and usage."""
    trace = dataclasses.asdict(answer.trace)
    trace.update(
        num_chunks_used=answer.trace.num_chunks_used,
        num_processed_tokens=answer.trace.num_processed_tokens,
        num_recomputed_tokens=answer.trace.num_recomputed_tokens,
    )
    return {
        "model": model,
        "answer": answer.text,
        "sources": [source(chunk, with_text=True) for chunk in answer.chunks],
        "trace": trace,
        "usage": usage(answer),
    }


@dataclass
class Completion:
    """The OpenAI objects of one completion (whole, or as stream chunks) of either kind."""

    kind: Kind
    model: str
    include_usage: bool = False
    completion_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))

    def whole(self, answer: Answer, params: GenerationParams) -> dict[str, Any]:
        """The non-streamed response."""
        choice: dict[str, Any] = {"index": 0, "logprobs": None}
        if self.kind == "chat":
            choice["message"] = {"role": "assistant", "content": answer.text}
        else:
            choice["text"] = answer.text
        choice["finish_reason"] = finish_reason(answer, params)
        body = self._envelope(whole=True)
        body.update(
            choices=[choice],
            usage=usage(answer),
            adarag=trace_summary(answer.chunks, answer.trace),
        )
        return body

    def first_chunk(self, chunks: Sequence[Chunk], trace: QueryTrace) -> str:
        """The opening event: the assistant role (chat), the sources in ``adarag``."""
        delta = {"role": "assistant", "content": ""} if self.kind == "chat" else None
        return self._event(self._chunk(delta, "", None) | {"adarag": trace_summary(chunks, trace)})

    def delta_chunk(self, text: str) -> str:
        """An event carrying one text delta."""
        delta = {"content": text} if self.kind == "chat" else None
        return self._event(self._chunk(delta, text, None))

    def last_chunks(self, answer: Answer, params: GenerationParams) -> list[str]:
        """The closing events: the finish reason, the usage (when asked for), ``[DONE]``."""
        events = [self._event(self._chunk({}, "", finish_reason(answer, params)))]
        if self.include_usage:
            body = self._envelope(whole=False)
            body.update(choices=[], usage=usage(answer))
            events.append(self._event(body))
        events.append(DONE)
        return events

    def _chunk(self, delta: dict[str, Any] | None, text: str, finish: str | None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
        if self.kind == "chat":
            choice["delta"] = delta if delta is not None else {}
        else:
            choice["text"] = text
        body = self._envelope(whole=False)
        body["choices"] = [choice]
        if self.include_usage:
            body["usage"] = None
        return body

    def _envelope(self, *, whole: bool) -> dict[str, Any]:
        if self.kind == "chat":
            prefix, kind = "chatcmpl", "chat.completion" if whole else "chat.completion.chunk"
        else:
            prefix, kind = "cmpl", "text_completion"
        return {
            "id": f"{prefix}-{self.completion_id}",
            "object": kind,
            "created": self.created,
            "model": self.model,
        }

    @staticmethod
    def _event(body: dict[str, Any]) -> str:
        return sse_event(body)


DONE = "data: [DONE]\n\n"
"""The event that ends an OpenAI stream."""


def sse_event(body: dict[str, Any]) -> str:
    """One server-sent event carrying ``body`` as JSON."""
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"
