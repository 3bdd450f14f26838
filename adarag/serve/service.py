"""The engine behind the routes: one pipeline, its slots and threads, answers whole or streamed."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from adarag.config import ServeConfig
from adarag.errors import AdaRagError, BackendError, ConfigError, InputError, KnowledgeBaseError
from adarag.pipeline import AdaRAG, AnswerStream
from adarag.retrievers import KnowledgeBase
from adarag.schema import Answer, GenerationParams
from adarag.serve.documents import EMPTY_KNOWLEDGE_BASE
from adarag.serve.errors import APIError, internal_error, invalid_request
from adarag.serve.metrics import Outcome, ServerMetrics, outcome_of
from adarag.serve.responses import DONE, Completion, sse_event
from adarag.serve.scheduler import EngineSlots, EngineWorker, Slot

logger = logging.getLogger(__name__)

StartAnswer = Callable[[], AnswerStream]
"""Retrieves and prefills (in a worker thread); returns the answer's stream."""


def api_error(err: AdaRagError) -> APIError:
    """An adarag error as HTTP: bad input 400, an empty knowledge base 409, no backend 503."""
    if isinstance(err, InputError | ConfigError):
        return invalid_request(str(err))
    if isinstance(err, KnowledgeBaseError):
        return APIError(409, str(err), error_type="invalid_request_error", code="knowledge_base")
    if isinstance(err, BackendError):
        return APIError(503, str(err), error_type="server_error", code="backend_unavailable")
    return APIError(500, str(err), error_type="server_error", code=type(err).__name__)


class EngineService:
    """Serves requests from one :class:`AdaRAG`, at most ``config.max_active_requests`` at once.

    Args:
        rag: The pipeline (its retriever is the knowledge base chat requests answer from).
        config: The server settings.
        model_id: The id listed by ``/v1/models``.
    """

    def __init__(self, rag: AdaRAG, config: ServeConfig, model_id: str) -> None:
        self.rag = rag
        self.config = config
        self.model_id = model_id
        self.slots = EngineSlots(config.max_active_requests, config.max_queued_requests)
        self.worker = EngineWorker(config.max_active_requests, config.request_timeout_s)
        self.metrics = ServerMetrics(
            lambda: self.slots.num_active, lambda: self.slots.num_queued, rag.cache_stats
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_shutdown: list[Callable[[], None]] = []

    async def start(self) -> None:
        """Load the model (and open the cache) before the first request."""
        self._loop = asyncio.get_running_loop()
        await asyncio.to_thread(lambda: self.rag.cache)

    def begin_shutdown_threadsafe(self) -> None:
        """From any thread (a signal handler): refuse new and queued requests from now on."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._begin_shutdown)

    def call_on_shutdown(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` in the event loop when a shutdown begins (to stop work at once)."""
        self._on_shutdown.append(callback)

    def _begin_shutdown(self) -> None:
        for callback in self._on_shutdown:
            callback()
        if not self.slots.is_closing:
            refused = self.slots.close()
            logger.info(
                "shutting down: %d active requests finish, %d queued refused",
                self.slots.num_active,
                refused,
            )

    async def stop(self) -> None:
        """Refuse new work, wait for engine work to end, then flush the KV cache to disk."""
        self._begin_shutdown()
        try:
            async with asyncio.timeout(self.config.shutdown_grace_s + 5.0):
                await self.slots.wait_idle()
        except TimeoutError:
            logger.warning("engine work still running at shutdown; flushing after it ends")
        await asyncio.to_thread(self.worker.shutdown)
        await asyncio.to_thread(self.rag.close)
        logger.info("KV cache flushed")

    async def answer(self, start: StartAnswer, route: str = "rag_query") -> Answer:
        """The whole answer of ``start``'s stream, within the request's deadline.

        Args:
            start: Retrieves and prefills.
            route: The route, as the request metrics name it.

        Raises:
            APIError: 429 queue full, 503 shutting down, 504 timed out, 400 bad input.
        """
        outcome: Outcome = "cancelled"
        arrived = time.perf_counter()
        try:
            slot, deadline = await self._admit()
            try:
                stream = await self._start(slot, deadline, start)
                first_token_at = time.perf_counter()
                try:
                    answer = await self.worker.call(slot, deadline, "answering", stream.answer)
                finally:
                    self.worker.close_stream(slot, stream)  # nothing to do once it has ended
                self._observe(answer, arrived, first_token_at)
                outcome = "ok"
                return answer
            finally:
                slot.release()
        except APIError as err:
            outcome = outcome_of(err.status)
            raise
        except Exception:
            outcome = "error"
            raise
        finally:
            self.metrics.count(route, outcome)

    async def stream(
        self, start: StartAnswer, params: GenerationParams, completion: Completion
    ) -> tuple[AsyncIterator[str], Callable[[], None]]:
        """Admit and prefill now (errors become HTTP statuses); return the events to stream.

        Returns:
            The events, and the clean-up to run when the response ends however it ends (also
            when the events were never iterated): it closes the stream and frees the slot.

        Raises:
            APIError: 429 queue full, 503 shutting down, 504 timed out, 400 bad input.
        """
        route = route_name(completion)
        arrived = time.perf_counter()
        try:
            slot, deadline = await self._admit()
        except APIError as err:
            self.metrics.count(route, outcome_of(err.status))
            raise
        try:
            stream = await self._start(slot, deadline, start)
        except BaseException as err:
            slot.release()
            self.metrics.count(
                route, outcome_of(err.status) if isinstance(err, APIError) else "error"
            )
            raise

        def finish() -> None:
            self.worker.close_stream(slot, stream)
            slot.release()

        timing = (arrived, time.perf_counter())  # prefilled: the first token is out
        return self._events(slot, deadline, stream, params, completion, finish, timing), finish

    async def _events(
        self,
        slot: Slot,
        deadline: float,
        stream: AnswerStream,
        params: GenerationParams,
        completion: Completion,
        finish: Callable[[], None],
        timing: tuple[float, float],
    ) -> AsyncIterator[str]:
        """The stream's events; a failure mid-stream ends it with an error event and ``[DONE]``.

        The client going away (or the server's grace period running out) cancels the task:
        the stream is then closed in a worker thread and its slot freed once it is.
        ``timing`` is when the request arrived and when its first token was out
        (``time.perf_counter()``).
        """
        outcome: Outcome = "cancelled"
        try:
            yield completion.first_chunk(stream.chunks, stream.trace)
            while True:
                delta = await self.worker.call(slot, deadline, "streaming", next, stream, None)
                if delta is None:
                    break
                yield completion.delta_chunk(delta)
            answer = stream.answer()
            self._observe(answer, *timing)
            for event in completion.last_chunks(answer, params):
                yield event
            outcome = "ok"
        except APIError as err:
            logger.info("stream ended early: %s", err.message)
            outcome = outcome_of(err.status)
            yield sse_event(err.body())
            yield DONE
        except AdaRagError as err:
            outcome = outcome_of(api_error(err).status)
            yield sse_event(api_error(err).body())
            yield DONE
        except Exception as err:  # a bug must still end the stream as the client expects
            logger.exception("stream failed")
            outcome = "error"
            yield sse_event(internal_error(err).body())
            yield DONE
        finally:
            self.metrics.count(route_name(completion), outcome)
            finish()

    async def _admit(self) -> tuple[Slot, float]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.request_timeout_s
        return await self.slots.acquire(deadline, self.config.request_timeout_s), deadline

    async def _start(self, slot: Slot, deadline: float, start: StartAnswer) -> AnswerStream:
        try:
            stream = await self.worker.call(slot, deadline, "before its first token", start)
        except KnowledgeBaseError as err:
            raise await self._knowledge_base_error(err) from err
        except AdaRagError as err:
            raise api_error(err) from err
        self.metrics.observe_prefill(stream.trace)
        return stream

    async def _knowledge_base_error(self, err: KnowledgeBaseError) -> APIError:
        """409 saying how to fill the knowledge base when it is empty; ``err`` as HTTP otherwise.

        The message names the HTTP routes, not ``adarag ingest``, which cannot open the Chroma
        directory the server holds.
        """
        kb = self.rag.retriever
        try:
            is_empty = isinstance(kb, KnowledgeBase) and await asyncio.to_thread(kb.count) == 0
        except Exception:  # the knowledge base cannot be read: its own error says why
            is_empty = False
        if not is_empty:
            return api_error(err)
        return APIError(
            409, EMPTY_KNOWLEDGE_BASE, error_type="invalid_request_error", code="knowledge_base"
        )

    def _observe(self, answer: Answer, arrived: float, first_token_at: float) -> None:
        """Record an answer's latency, generated tokens and time per token after the first."""
        ended = time.perf_counter()
        self.metrics.observe_answer(
            answer.num_completion_tokens, ended - arrived, ended - first_token_at
        )

    def health(self) -> dict[str, Any]:
        """The server's state and load."""
        return {
            "status": "shutting_down" if self.slots.is_closing else "ok",
            "model": self.model_id,
            "active_requests": self.slots.num_active,
            "queued_requests": self.slots.num_queued,
            # None, or why chunk KV is not written to disk (answers are still served)
            "kv_disk_problem": self.rag.cache_disk_problem,
        }


def route_name(completion: Completion) -> str:
    """The route of a completion, as the request metrics name it."""
    return "chat" if completion.kind == "chat" else "completions"
