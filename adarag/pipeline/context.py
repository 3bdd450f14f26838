"""A request's context: the question checked, chunks retrieved and arranged, fitted to the model.

:func:`retrieve` validates a question and ``top_k`` before the retriever is asked
(:func:`top_k_chunks`: a question already checked);
:func:`request_context` arranges the found chunks (see :mod:`adarag.pipeline.arrange`) and lays
out as many as fit the model's context, with the order hint; :func:`numbered` gives the chunks
their citation numbers.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from adarag.config import AdaRagConfig
from adarag.errors import ConfigError, InputError
from adarag.pipeline.arrange import Arrangement, arrange, wants_cached_order
from adarag.pipeline.prompt import (
    CITATION_KEY,
    PromptBuilder,
    Turn,
    check_text,
    instruction_note,
)
from adarag.pipeline.resources import Resources
from adarag.retrievers.base import Retriever
from adarag.schema import Chunk, GenerationParams, PromptLayout

# the records keep the name of the pipeline's logger
logger = logging.getLogger("adarag.pipeline.rag")


@dataclass
class RequestContext:
    """The prompt of a request (None without any chunk), its chunks, order hint and drops."""

    layout: PromptLayout | None
    chunks: list[Chunk]
    note: str
    num_dropped: int


def check_question(question: str) -> None:
    """Refuses a question that is not text or is empty, before a retriever or tokenizer sees it.

    Raises:
        InputError: The question is not text or is empty.
    """
    check_text(question, "the question")  # before a retriever or tokenizer sees it
    if not question.strip():
        raise InputError("the question is empty; pass a non-empty question")


def retrieve(
    retriever: Retriever | None, config: AdaRagConfig, question: str, top_k: int | None
) -> list[Chunk]:
    """The retriever's top-k chunks for ``question`` (see ``AdaRAG.retrieve``)."""
    given = required(retriever)
    check_question(question)
    return top_k_chunks(given, config, question, top_k)


def required(retriever: Retriever | None) -> Retriever:
    """``retriever``, which a request without chunks needs.

    Raises:
        ConfigError: There is none.
    """
    if retriever is None:
        raise ConfigError("no retriever configured; pass retriever=... or chunks=[...]")
    return retriever


def as_chunks(items: Sequence[Chunk | str]) -> tuple[Chunk, ...]:
    """``items`` as :class:`Chunk` values (a text becomes a chunk without metadata)."""
    return tuple(item if isinstance(item, Chunk) else Chunk(item) for item in items)


def top_k_chunks(
    retriever: Retriever, config: AdaRagConfig, query: str, top_k: int | None
) -> list[Chunk]:
    """The retriever's top-k chunks for a checked ``query`` (``top_k`` checked first)."""
    k = config.retrieval.top_k if top_k is None else top_k
    if k < 1:
        raise InputError(f"top_k must be at least 1, got {k}")
    max_top_k = config.retrieval.max_top_k
    if k > max_top_k:
        raise InputError(
            f"top_k is {k}, above retrieval.max_top_k={max_top_k}; ask for at most "
            f"{max_top_k} chunks (the model's context holds only a few anyway), or raise "
            "retrieval.max_top_k"
        )
    return list(retriever.retrieve(query, k))


def request_context(
    resources: Resources,
    question: str,
    found: Sequence[Chunk],
    params: GenerationParams,
    history: Sequence[Turn],
    conversation_chunks: Sequence[Chunk | str],
    instruction: str = "",
) -> RequestContext:
    """``found`` arranged and fitted to the model's context, with the order hint.

    ``instruction`` (see :class:`~adarag.pipeline.request.Request`) goes before the order hint,
    both right before the question; the returned ``note`` is the order hint alone.
    """
    config, prompts = resources.config, resources.prompts
    arranged = arrange_chunks(resources, found, conversation_chunks) if found else None
    layout: PromptLayout | None = None
    fitting: list[Chunk] = []
    note = ""
    instructed = instruction_note(instruction)
    if arranged is not None:
        note = arranged.hint(config)
        max_context_tokens = resources.engine.max_context_tokens
        layout, fitting = fit_context(
            prompts,
            max_context_tokens,
            question,
            arranged.chunks,
            params,
            history,
            instructed + note,
        )
        if layout is not None and len(fitting) < len(arranged.chunks) and note:
            note = arranged.hint(config, len(fitting))
            history_ids, query_ids = prompts.query_segments(question, history, instructed + note)
            layout = dataclasses.replace(layout, history_ids=history_ids, query_ids=query_ids)
    dropped = (len(arranged.chunks) if arranged else 0) - len(fitting)
    return RequestContext(layout, fitting, note, dropped)


def arrange_chunks(
    resources: Resources, found: Sequence[Chunk], conversation_chunks: Sequence[Chunk | str]
) -> Arrangement:
    """The retrieved chunks in listed order (see :mod:`adarag.pipeline.arrange`)."""
    earlier = as_chunks(conversation_chunks)
    for idx, chunk in enumerate(earlier):
        if not isinstance(chunk.text, str) or not chunk.text.strip():
            raise InputError(
                f"conversation chunk {idx} is empty or not text; pass the earlier answer's "
                "chunks as they were"
            )
    order = None
    if wants_cached_order(resources.config, earlier):
        chunk_ids = [resources.prompts.chunk_ids(chunk.text) for chunk in found]
        order = resources.cache.longest_cached_prefix(chunk_ids).order
    return arrange(found, resources.config, order, earlier)


def fit_context(
    prompts: PromptBuilder,
    max_context_tokens: int,
    question: str,
    chunks: Sequence[Chunk],
    params: GenerationParams,
    history: Sequence[Turn] = (),
    note: str = "",
) -> tuple[PromptLayout | None, list[Chunk]]:
    """The prompt with as many of ``chunks`` (best first) as fit the model's context.

    Lower-ranked chunks that do not fit are left out with a warning; without any chunk the
    layout is None. Chunks are tokenized best first until the context is full, so the work
    and memory of a request are bounded by the context, however many chunks it passes.

    Raises:
        InputError: A chunk is empty, or the question alone (with the system prompt and the
            answer's tokens) does not fit.
    """
    for idx, chunk in enumerate(chunks):  # every chunk, also those left out untokenized
        if not isinstance(chunk.text, str):
            raise InputError(f"chunk {idx} is not text; pass its text as a string")
        if not chunk.text.strip():
            raise InputError(f"chunk {idx} is empty; drop it or pass its text")
    system_ids = prompts.system_ids
    history_ids, query_ids = prompts.query_segments(question, history, note)
    room = max_context_tokens - params.max_new_tokens
    alone = len(system_ids) + sum(map(len, history_ids)) + len(query_ids)
    used = alone
    fitting: list[tuple[int, ...]] = []
    for chunk in chunks:
        ids = prompts.chunk_ids(chunk.text)
        num_tokens = len(ids)
        if prompts.config.citations:  # its citation label
            num_tokens += len(prompts.chunk_label_ids(len(fitting) + 1))
        if used + num_tokens > room:
            break  # this chunk and every lower-ranked one are left out, untokenized
        used += num_tokens
        fitting.append(ids)
    keep = len(fitting)
    if keep < len(chunks):
        if alone > room:
            raise InputError(
                f"the question alone makes a {alone}-token prompt, and with "
                f"{params.max_new_tokens} new tokens it exceeds the model's context of "
                f"{max_context_tokens} tokens; shorten the question or ask "
                "for fewer new tokens"
            )
        logger.warning(
            "left out %d of %d retrieved chunks (lowest-ranked first): with them the prompt "
            "and %d new tokens exceed the model's context of %d tokens",
            len(chunks) - keep,
            len(chunks),
            params.max_new_tokens,
            max_context_tokens,
        )
    labels = prompts.chunk_labels(keep)
    layout = PromptLayout(system_ids, tuple(fitting), query_ids, history_ids, labels)
    return (layout if keep else None), list(chunks[:keep])


def numbered(chunks: Sequence[Chunk]) -> tuple[Chunk, ...]:
    """The chunks with their citation numbers (1 for the first) in their metadata."""
    return tuple(
        dataclasses.replace(chunk, metadata={**chunk.metadata, CITATION_KEY: idx + 1})
        for idx, chunk in enumerate(chunks)
    )
