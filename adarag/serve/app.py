"""The FastAPI application: OpenAI's chat, completions and models routes, and the RAG query."""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.types import Receive, Scope, Send

from adarag.config import ServeConfig
from adarag.errors import AdaRagError
from adarag.pipeline import AdaRAG, AnswerStream
from adarag.pipeline import Request as RagRequest
from adarag.schema import GenerationParams
from adarag.serve.documents import EMPTY_KNOWLEDGE_BASE
from adarag.serve.errors import APIError, invalid_request, model_not_found, unauthorized
from adarag.serve.http_errors import add_http_error_handler
from adarag.serve.knowledge_routes import add_knowledge_routes
from adarag.serve.limits import RequestLimits
from adarag.serve.origins import OriginCheck
from adarag.serve.protocol import ChatCompletionRequest, CompletionRequest, RagQueryRequest
from adarag.serve.responses import Completion, rag_answer
from adarag.serve.service import EngineService, StartAnswer, api_error, route_name

logger = logging.getLogger(__name__)


class EventStreamResponse(StreamingResponse):
    """Server-sent events whose clean-up runs however the response ends."""

    def __init__(self, events: AsyncIterator[str], finish: Callable[[], None]) -> None:
        super().__init__(events, media_type="text/event-stream")
        self.headers["Cache-Control"] = "no-cache"
        self._finish = finish

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Send the events, then clean up (also when the client went away)."""
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._finish()


def create_app(
    rag: AdaRAG, config: ServeConfig | None = None, *, api_key: str | None = None
) -> FastAPI:
    """The OpenAI-compatible application over ``rag`` (its retriever is the knowledge base).

    Besides OpenAI's chat, completions and models routes and ``/v1/rag/query``: documents
    added, listed and deleted at ``/v1/files`` (when the retriever is a knowledge base),
    ``/v1/embeddings``, Prometheus ``/metrics`` and the chat page at ``/``. A request sent by a
    web page of another origin than the server's and ``config.allowed_origins`` is refused
    (:class:`~adarag.serve.origins.OriginCheck`); :class:`~adarag.serve.AdaRagServer` also
    checks the ``Host`` each request names.

    Args:
        rag: The pipeline; the model loads when the application starts.
        config: Server settings; ``rag.config.serve`` when None.
        api_key: The key clients must send as ``Authorization: Bearer KEY``; None or empty:
            no key is required.
    """
    config = config or rag.config.serve
    service = EngineService(rag, config, config.model_name or _checkpoint_name(rag))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await service.start()
        if library is not None:  # the documents a stop cut short are warmed again
            await asyncio.to_thread(library.resume)
            if await asyncio.to_thread(library.is_empty):
                logger.warning(EMPTY_KNOWLEDGE_BASE)
        logger.info("serving %s", service.model_id)
        yield
        if library is not None:
            await asyncio.to_thread(library.close)  # no warming after the cache is flushed
        await service.stop()

    app = FastAPI(title="adarag", summary="OpenAI-compatible RAG server", lifespan=lifespan)
    app.state.service = service
    app.add_middleware(RequestLimits, config=config, api_key=api_key)
    if config.allowed_origins:  # their pages may read answers, and preflights need no key
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(config.allowed_origins),
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type"],
        )
    app.add_middleware(OriginCheck, config=config)  # outermost: a foreign page gets nothing
    _add_error_handlers(app)
    check_key = _key_check(api_key)
    app.include_router(_routes(service, check_key))
    library = add_knowledge_routes(app, service, config, check_key)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return service.health()

    return app


def _routes(service: EngineService, check_key: Callable[[Request], None]) -> APIRouter:
    config = service.config
    rag = service.rag
    router = APIRouter(prefix="/v1", dependencies=[Depends(check_key)])

    @router.get("/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {"id": service.model_id, "object": "model", "created": 0, "owned_by": "adarag"}
            ],
        }

    @router.get("/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        if model_id != service.model_id:
            raise model_not_found(model_id, service.model_id)
        return {"id": model_id, "object": "model", "created": 0, "owned_by": "adarag"}

    @router.post("/chat/completions", response_model=None)
    async def chat_completions(body: ChatCompletionRequest) -> Any:
        params = body.params(config.default_max_tokens)
        if body.rag:
            try:
                question, history = body.conversation(config.history_turns)
            except ValueError as err:
                raise invalid_request(str(err), "messages") from err
            start: StartAnswer = partial(
                _stream_instructed, rag, question, history, params, body.top_k, body.instruction()
            )
        else:
            start = partial(rag.generate, body.chat_messages(), params=params)
        return await _respond(service, start, params, Completion("chat", service.model_id), body)

    @router.post("/completions", response_model=None)
    async def completions(body: CompletionRequest) -> Any:
        params = body.params(config.default_max_tokens)
        if body.rag:
            start: StartAnswer = partial(
                rag.stream, body.prompt_text, params=params, top_k=body.top_k
            )
        else:
            start = partial(rag.generate, body.prompt_text, params=params)
        return await _respond(service, start, params, Completion("text", service.model_id), body)

    @router.post("/rag/query")
    async def rag_query(body: RagQueryRequest) -> dict[str, Any]:
        _check_given_chunks(body, rag.config.retrieval.max_top_k)
        params = body.params()
        start = partial(
            rag.stream,
            body.question,
            chunks=body.chunks,
            history=body.history,
            params=params,
            top_k=body.top_k,
        )
        return rag_answer(await service.answer(start), service.model_id)

    return router


def _stream_instructed(
    rag: AdaRAG,
    question: str,
    history: list[tuple[str, str]],
    params: GenerationParams,
    top_k: int | None,
    instruction: str,
) -> AnswerStream:
    """``rag.stream`` with an instruction (a chat's system messages); checked in the worker."""
    request = RagRequest.of(
        question, params=params, top_k=top_k, history=history, instruction=instruction
    )
    return rag.stream_request(request)


def _check_given_chunks(body: RagQueryRequest, max_chunks: int) -> None:
    """Refuse more caller-given chunks than retrieval may find (before any prefill)."""
    if body.chunks is not None and len(body.chunks) > max_chunks:
        raise invalid_request(
            f"chunks holds {len(body.chunks)} texts, above retrieval.max_top_k={max_chunks}; "
            f"send at most {max_chunks} (the model's context holds only a few), or raise "
            "retrieval.max_top_k",
            "chunks",
        )


async def _respond(
    service: EngineService,
    start: StartAnswer,
    params: GenerationParams,
    completion: Completion,
    body: ChatCompletionRequest | CompletionRequest,
) -> Any:
    """The whole completion as JSON, or its stream of events."""
    if not body.stream:
        return completion.whole(await service.answer(start, route_name(completion)), params)
    completion.include_usage = body.include_usage
    events, finish = await service.stream(start, params, completion)
    return EventStreamResponse(events, finish)


def _key_check(api_key: str | None) -> Callable[[Request], None]:
    """A dependency refusing requests without ``Authorization: Bearer <api_key>``."""
    expected = f"Bearer {api_key}".encode() if api_key else None

    def check_key(request: Request) -> None:
        if expected is None:
            return
        given = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(given, expected):
            raise unauthorized()

    return check_key


def _add_error_handlers(app: FastAPI) -> None:
    add_http_error_handler(app)  # 404 and 405 in OpenAI's format too

    @app.exception_handler(APIError)
    async def on_api_error(request: Request, err: APIError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    @app.exception_handler(AdaRagError)
    async def on_adarag_error(request: Request, err: AdaRagError) -> JSONResponse:
        failure = api_error(err)
        return JSONResponse(failure.body(), status_code=failure.status)

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, err: Exception) -> JSONResponse:
        logger.exception("request failed")
        failure = APIError(500, f"internal error: {type(err).__name__}", error_type="server_error")
        return JSONResponse(failure.body(), status_code=500)

    @app.exception_handler(RequestValidationError)
    async def on_invalid_body(request: Request, err: RequestValidationError) -> JSONResponse:
        failure = _describe_invalid(err)
        return JSONResponse(failure.body(), status_code=failure.status)


def _describe_invalid(err: RequestValidationError) -> APIError:
    """The first problem of an invalid body, naming its field (``messages.0.role``)."""
    errors = err.errors()
    if not errors:
        return invalid_request("the request body is invalid")
    first = errors[0]
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    # a union member's name (``str``, ``list[...]``) says nothing to the client
    field = ".".join(p for p in location if p not in ("str", "int", "list") and "[" not in p)
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if first.get("type") == "json_invalid":
        return invalid_request(f"the request body is not valid JSON ({message})")
    if not field and first.get("type") in ("missing", "model_attributes_type", "dict_type"):
        return invalid_request("the request body must be a JSON object")
    value = first.get("input")
    if first.get("type") not in ("missing", "extra_forbidden") and isinstance(
        value, str | int | float | bool
    ):
        shown = repr(value)
        message += f" (got {shown[:60] + '...' if len(shown) > 60 else shown})"
    if first.get("type") == "extra_forbidden":
        message = "unknown field (check its spelling)"
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return invalid_request(f"{field or 'body'}: {message}{more}", field or None)


def _checkpoint_name(rag: AdaRAG) -> str:
    """The model id to list: the loaded checkpoint's name (loads the model)."""
    started = time.perf_counter()
    name = str(rag.engine.checkpoint.name)
    logger.info("model %s ready in %.1f s", name, time.perf_counter() - started)
    return name
