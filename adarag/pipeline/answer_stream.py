"""The answer to one question as it streams: text deltas, the chunks used and the trace."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from adarag.engine.batch import PrefillOutput
from adarag.pipeline.detokenizer import StreamingDetokenizer
from adarag.pipeline.write_back import WriteBack, write_back
from adarag.schema import Answer, Chunk, GenerationParams, PromptLayout, QueryTrace

NO_CONTEXT_ANSWER = "I found no context for this question in the knowledge base."


@dataclass
class PreparedAnswer:
    """A question after retrieval and prefill, ready to decode.

    Attributes:
        layout: The prompt the answer decodes from; None when retrieval found nothing.
        output: Its prefill; None when retrieval found nothing.
        chunks: The chunks in that prompt, in listed order (the retriever's unless
            ``experimental.arrangement`` arranged them).
        trace: What retrieval and augmentation did.
        num_cached_tokens: Prompt tokens whose KV was reused rather than recomputed.
        write_back: The prompt's fused KV to store in the cache, stored once by the stream
            after the answer (without the engine lock); None: nothing to store.
    """

    layout: PromptLayout | None
    output: PrefillOutput | None
    chunks: tuple[Chunk, ...]
    trace: QueryTrace
    num_cached_tokens: int
    write_back: WriteBack | None = None


def no_context(retrieval_s: float) -> PreparedAnswer:
    """The answer to a question retrieval found no chunk for."""
    trace = QueryTrace(
        steps=(), stop_reason="no_context", ttft_s=0.0, num_prompt_tokens=0, retrieval_s=retrieval_s
    )
    return PreparedAnswer(None, None, (), trace, 0)


def decode_text(tokens: Iterator[int], tokenizer: Any, params: GenerationParams) -> Iterator[str]:
    """Answer text deltas of generated token ids, cut at the first of ``params.stop``.

    Closing the deltas early closes ``tokens`` too (a backend request then ends).
    """
    detokenizer = StreamingDetokenizer(tokenizer, params.stop)
    try:
        for token in tokens:
            delta = detokenizer.push(token)
            if delta:
                yield delta
            if detokenizer.stopped:
                return
        tail = detokenizer.flush()
        if tail:
            yield tail
    finally:
        close = getattr(tokens, "close", None)
        if close is not None:
            close()


def answer_text(tokens: Iterable[int], tokenizer: Any, params: GenerationParams) -> str:
    """The whole answer of generated token ids, cut as :func:`decode_text` cuts it, stripped."""
    return "".join(decode_text(iter(tokens), tokenizer, params)).strip()


@dataclass
class TokenCount:
    """How many answer tokens a decode has produced so far."""

    value: int = 0


class AnswerStream(Iterator[str]):
    """Answer text deltas; ``chunks`` and ``trace`` are known before the first delta.

    Iterate it for deltas, or call :meth:`answer` for the whole :class:`Answer`. When the last
    delta is out, or the stream is closed, the prompt's KV is written back to the cache and the
    stream lets go of it (the prefill's KV is freed once nothing else holds it). A stream is
    used by one consumer at a time, but :meth:`close` may come from any thread: it waits for a
    step in flight.

    Args:
        prepared: The prefilled answer.
        deltas: Its text deltas as they are decoded (counting tokens in ``num_tokens``).
        num_tokens: The answer tokens decoded so far.
    """

    def __init__(
        self, prepared: PreparedAnswer, deltas: Iterator[str], num_tokens: TokenCount
    ) -> None:
        self.chunks = prepared.chunks
        self.trace = prepared.trace
        self._prepared = prepared
        self._parts: list[str] = []
        self._num_tokens = num_tokens
        self._lock = threading.Lock()  # one step at a time; close waits for the one in flight
        self._finished = False
        self._deltas = deltas

    def __next__(self) -> str:
        with self._lock:
            if self._finished:
                raise StopIteration
            try:
                delta = next(self._deltas)
            except BaseException:  # the end, or a failure: either way the stream is over
                self._finish()
                raise
            self._parts.append(delta)
            return delta

    def close(self) -> None:
        """Stop decoding early; the prompt's KV is still written back to the cache.

        Idempotent, and safe from another thread than the consumer's.
        """
        with self._lock:
            self._finish()

    @property
    def closed(self) -> bool:
        """Whether the stream has ended (last delta out, closed, or failed)."""
        return self._finished

    def _finish(self) -> None:
        """Close the decoder, run the write-back once and drop the prefill (lock held)."""
        if self._finished:
            return
        self._finished = True
        prepared = self._prepared
        try:
            close = getattr(self._deltas, "close", None)
            if close is not None:
                close()  # ends the decode steps (and a backend request) where they stand
            self._deltas = iter(())
            pending, prepared.write_back = prepared.write_back, None
            if pending is not None:
                write_back(pending)
        finally:
            prepared.output = None  # the prefill's KV: freed unless the caller holds it

    @property
    def first_token_logits(self) -> torch.Tensor | None:
        """[vocab] logits of the first answer token; None without context or once finished."""
        output = self._prepared.output
        return None if output is None else output.logits

    @property
    def text(self) -> str:
        """The answer text streamed so far."""
        return "".join(self._parts)

    def answer(self) -> Answer:
        """Consume the rest of the stream and return the whole answer."""
        for _ in self:
            pass
        return Answer(
            text=self.text.strip(),
            chunks=self.chunks,
            trace=self.trace,
            num_completion_tokens=self._num_tokens.value,
            num_cached_tokens=self._prepared.num_cached_tokens,
        )


class AsyncAnswerStream(AsyncIterator[str]):
    """Async iteration over an :class:`AnswerStream`; each step runs in a worker thread.

    Stop early with :meth:`aclose`. A task cancelled while it awaits a step closes the stream
    too: the step in flight finishes in its thread, then the stream is closed there (its KV
    written back and freed) without holding up the event loop.
    """

    def __init__(self, stream: AnswerStream) -> None:
        self.stream = stream
        self.chunks = stream.chunks
        self.trace = stream.trace

    async def __anext__(self) -> str:
        try:
            delta = await asyncio.to_thread(next, self.stream, None)
        except asyncio.CancelledError:
            self._close_in_background()
            raise
        if delta is None:
            raise StopAsyncIteration
        return delta

    async def answer(self) -> Answer:
        """Consume the rest of the stream and return the whole answer."""
        try:
            return await asyncio.to_thread(self.stream.answer)
        except asyncio.CancelledError:
            self._close_in_background()
            raise

    async def aclose(self) -> None:
        """Stop decoding early (see :meth:`AnswerStream.close`), in a worker thread."""
        try:
            await asyncio.to_thread(self.stream.close)
        except asyncio.CancelledError:
            self._close_in_background()
            raise

    def _close_in_background(self) -> None:
        """Close the stream once its step in flight ends, in a worker thread.

        ``asyncio.run`` waits for it before it returns (it shuts the default executor down).
        """
        asyncio.get_running_loop().run_in_executor(None, self.stream.close)
