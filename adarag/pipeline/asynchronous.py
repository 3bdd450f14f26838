"""The async twins of the pipeline's answering methods: each call runs in a worker thread.

:class:`AsyncAnswering` is a base of :class:`~adarag.pipeline.rag.AdaRAG`; the event loop never
runs engine work, and each decode step of an async stream runs in a worker thread too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Unpack

from adarag.pipeline.answer_stream import AnswerStream, AsyncAnswerStream
from adarag.pipeline.request import AnswerOptions, Request
from adarag.schema import Answer, GenerationParams


class AsyncAnswering:
    """``aquery``, ``astream`` and ``agenerate`` over the synchronous methods of a pipeline.

    Attributes:
        stream_request: Prefills a request, returns its stream (``AdaRAG.stream_request``).
        generate: Prefills a plain prompt and returns a stream of deltas (``AdaRAG.generate``).
    """

    stream_request: Callable[[Request], AnswerStream]
    generate: Callable[..., AnswerStream]

    async def aquery(self, question: str, **options: Unpack[AnswerOptions]) -> Answer:
        """Async :meth:`query`; the work runs in a worker thread, never on the event loop."""
        request = Request.of(question, **options)
        return await asyncio.to_thread(lambda: self.stream_request(request).answer())

    async def astream(self, question: str, **options: Unpack[AnswerOptions]) -> AsyncAnswerStream:
        """Async :meth:`stream`; prefill and each decode step run in a worker thread."""
        request = Request.of(question, **options)
        return AsyncAnswerStream(await asyncio.to_thread(self.stream_request, request))

    async def agenerate(
        self,
        prompt: str | Sequence[Mapping[str, str]],
        *,
        params: GenerationParams | None = None,
    ) -> AsyncAnswerStream:
        """Async :meth:`generate`; prefill and each decode step run in a worker thread."""
        stream = await asyncio.to_thread(self.generate, prompt, params=params)
        return AsyncAnswerStream(stream)
