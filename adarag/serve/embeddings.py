"""``POST /v1/embeddings``: OpenAI's embeddings route, with the knowledge base's embedding model.

The vectors are the ones the knowledge base stores and searches with (all-MiniLM-L6-v2 by
default, L2-normalised), so a client embedding through the server (LangChain's
``OpenAIEmbeddings``, LlamaIndex's ``OpenAILikeEmbedding``, OpenAI's client) gets vectors
comparable with the stored ones. Inputs are texts; token ids (what ``OpenAIEmbeddings`` sends
unless ``check_embedding_ctx_length=False``) are refused, as they are another tokenizer's.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from adarag.retrievers import Embedder
from adarag.serve.errors import APIError, invalid_request
from adarag.serve.metrics import ServerMetrics, outcome_of

MAX_INPUTS = 2048
"""Texts one request may embed (OpenAI's limit)."""


class EmbeddingRequest(BaseModel):
    """OpenAI's embeddings body."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    input: str | list[str] | list[int] | list[list[int]]
    model: str = Field(min_length=1, description="Any id; the server's one model embeds.")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)

    def texts(self) -> list[str]:
        """The texts to embed.

        Raises:
            APIError: 400, the input is token ids, empty, or too many texts.
        """
        given: list[Any] = [self.input] if isinstance(self.input, str) else list(self.input)
        texts = [text for text in given if isinstance(text, str)]
        if not given:
            raise invalid_request("input: give at least one text", "input")
        if len(texts) < len(given):
            raise invalid_request(
                "input: token ids are not accepted (they are another model's tokens); send the "
                "texts (LangChain: OpenAIEmbeddings(check_embedding_ctx_length=False))",
                "input",
            )
        if len(texts) > MAX_INPUTS:
            raise invalid_request(f"input: at most {MAX_INPUTS} texts per request", "input")
        if any(not text.strip() for text in texts):
            raise invalid_request("input: every text must be non-empty", "input")
        return texts


def embeddings_router(
    embedder: Callable[[], Embedder],
    metrics: ServerMetrics,
    check_key: Callable[[Request], None],
) -> APIRouter:
    """The ``/v1/embeddings`` route over the embedder ``embedder()`` returns (loaded on use)."""
    router = APIRouter(prefix="/v1", dependencies=[Depends(check_key)])
    one_at_a_time = asyncio.Semaphore(1)  # the model uses every CPU thread for one batch

    @router.post("/embeddings")
    async def embeddings(body: EmbeddingRequest) -> dict[str, Any]:
        try:
            texts = body.texts()
            model = await asyncio.to_thread(embedder)
            async with one_at_a_time:
                vectors = await asyncio.to_thread(model.embed_documents, texts)
            dimension = len(vectors[0])
            if body.dimensions is not None and body.dimensions != dimension:
                raise invalid_request(
                    f"dimensions: {model.name} embeddings have {dimension} dimensions, got "
                    f"{body.dimensions}; leave dimensions unset",
                    "dimensions",
                )
            num_tokens = await asyncio.to_thread(_count_tokens, model, texts)
        except APIError as err:
            metrics.count("embeddings", outcome_of(err.status))
            raise
        metrics.count("embeddings", "ok")
        return {
            "object": "list",
            "data": [
                {"object": "embedding", "index": idx, "embedding": _encoded(vector, body)}
                for idx, vector in enumerate(vectors)
            ],
            "model": model.name,
            "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
        }

    return router


def _encoded(vector: list[float], body: EmbeddingRequest) -> list[float] | str:
    """A vector as floats, or as base64 of its little-endian float32 bytes."""
    if body.encoding_format == "float":
        return vector
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


def _count_tokens(model: Embedder, texts: list[str]) -> int:
    """Tokens of ``texts`` by the embedding model's tokenizer (0 when it has none)."""
    count = getattr(model, "count_tokens", None)
    return int(count(texts)) if callable(count) else 0
