"""One request: the value the answering methods build once, and its preparation for decoding.

:class:`Request` is what ``AdaRAG.query`` / ``stream`` / ``aquery`` / ``astream`` take, built
by :meth:`Request.of`, which checks the question once. :func:`standalone_question` is the text a
conversation's question is retrieved with; :func:`prepare_answer` lays the context out, runs the
augmentation loop's prefills and notes the trace.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypedDict, Unpack

from adarag.config import ChatConfig
from adarag.pipeline.answer_stream import PreparedAnswer, no_context
from adarag.pipeline.context import (
    RequestContext,
    as_chunks,
    check_question,
    numbered,
    request_context,
)
from adarag.pipeline.gain_selection import GainSelection, select_by_gain, selects_by_gain
from adarag.pipeline.prompt import Turn, check_instruction, condense_prompt, retrieval_query
from adarag.pipeline.resources import Resources
from adarag.pipeline.steps import AugmentedPrefill
from adarag.schema import Chunk, GenerationParams

# the records keep the name of the pipeline's logger
logger = logging.getLogger("adarag.pipeline.rag")


class AnswerOptions(TypedDict, total=False):
    """How to answer a question: the keywords of ``query``, ``stream``, ``aquery``, ``astream``.

    Every key is optional.

    Attributes:
        chunks: The context; the retriever's top-k when None.
        params: Decoding options.
        top_k: Chunks to retrieve (``retrieval.top_k`` when None).
        history: Earlier turns of a conversation, oldest first, as (message, answer) pairs:
            they go into the prompt as chat turns after the context (the system prefix and the
            chunks' KV stay reusable), and the retriever searches for their messages together
            with the question. Pass only the turns to carry (see
            :class:`~adarag.conversation.Conversation`).
        conversation_chunks: The conversation's context so far in listed order (the last
            answer's ``chunks``); with ``experimental.arrangement.deduplicate`` it opens this
            turn's context and only retrieved chunks not in it are added.
        instruction: What the answer must follow besides the system prompt (a chat's system
            messages), placed right before the question; the cached prefix stays as it is.
    """

    chunks: Sequence[Chunk | str] | None
    params: GenerationParams | None
    top_k: int | None
    history: Sequence[Turn]
    conversation_chunks: Sequence[Chunk | str]
    instruction: str


@dataclass(frozen=True)
class Request:
    """One question to answer, and how (:class:`AnswerOptions` gives each field's meaning).

    Attributes:
        question: What to answer (checked by :meth:`of`).
        chunks: The context; None retrieves the retriever's top-k.
        params: Decoding options.
        top_k: Chunks to retrieve (``retrieval.top_k`` when None).
        history: Earlier turns of a conversation, oldest first.
        conversation_chunks: The conversation's context so far, in listed order.
        instruction: What the answer must follow besides the system prompt (a chat's system
            message, e.g. "Always answer in French."). It goes right before the question, after
            the context, so the system prefix and the chunks keep their cached KV; it is not
            part of what is retrieved with.
    """

    question: str
    chunks: tuple[Chunk, ...] | None = None
    params: GenerationParams = field(default_factory=GenerationParams)
    top_k: int | None = None
    history: tuple[Turn, ...] = ()
    conversation_chunks: tuple[Chunk | str, ...] = ()
    instruction: str = ""

    @classmethod
    def of(cls, question: str, **options: Unpack[AnswerOptions]) -> Request:
        """The request, its question and instruction checked, its chunks :class:`Chunk` values.

        Raises:
            InputError: The question is not text or is empty, or the instruction is not text
                the prompt can hold.
            TypeError: An option's name is not one of :class:`AnswerOptions` (as for a
                misspelt keyword of any function).
        """
        unknown = sorted(set(options) - AnswerOptions.__optional_keys__)
        if unknown:
            known = ", ".join(sorted(AnswerOptions.__optional_keys__))
            raise TypeError(f"unexpected keyword argument {unknown[0]!r}; the options are {known}")
        check_question(question)
        instruction = options.get("instruction", "")
        check_instruction(instruction)
        chunks = options.get("chunks")
        return cls(
            question,
            None if chunks is None else as_chunks(chunks),
            options.get("params") or GenerationParams(),
            options.get("top_k"),
            tuple(options.get("history", ())),
            tuple(options.get("conversation_chunks", ())),
            instruction,
        )


def condense_request(
    config: ChatConfig, question: str, history: Sequence[Turn]
) -> tuple[list[dict[str, str]], GenerationParams] | None:
    """The chat messages and decoding options of the model's rewrite of ``question``, or None.

    Only ``chat.standalone_question = "condense"`` with earlier turns asks the model (greedy,
    at most ``config.max_condense_tokens`` tokens); the caller generates the rewrite and passes
    it to :func:`standalone_question`.
    """
    if not history or config.standalone_question != "condense":
        return None
    prompt = condense_prompt(config.condense_prompt, question, history)
    params = GenerationParams(max_new_tokens=config.max_condense_tokens)
    return [{"role": "user", "content": prompt}], params


def standalone_question(
    config: ChatConfig, question: str, history: Sequence[Turn], rewrite: str | None = None
) -> str:
    """What ``question`` is retrieved with, after the earlier turns ``history``.

    ``"turns"``: the earlier questions, this one, then the earlier answers
    (:func:`retrieval_query` with answers), so a follow-up finds what an earlier answer named;
    ``"concatenate"``: the earlier questions, then this one; ``"condense"``: the model's rewrite
    of the question and the earlier turns as one standalone question (its first line), or the
    turns when the rewrite comes out empty. Without history it is ``question`` itself.

    Args:
        config: The chat settings.
        question: The new message.
        history: The earlier turns carried, oldest first.
        rewrite: The model's answer to :func:`condense_request`'s messages (``"condense"``).
    """
    if condense_request(config, question, history) is None:
        return retrieval_query(
            question, history, with_answers=config.standalone_question == "turns"
        )
    lines = [line.strip() for line in (rewrite or "").strip().splitlines() if line.strip()]
    if not lines:
        logger.warning("the condensed question came out empty; retrieving with the turns")
        return retrieval_query(question, history, with_answers=True)
    return lines[0]


def prepare_answer(
    resources: Resources,
    augmented: AugmentedPrefill,
    request: Request,
    found: Sequence[Chunk],
    started: float,
) -> PreparedAnswer:
    """The answer to ``request`` from ``found``, prefilled and ready to decode.

    The chunks are arranged and fitted to the model's context; without any chunk the answer is
    the no-context one. With ``augment.stop_rule = "gain"`` the fitted chunks are scored first
    and only those the gain keeps are laid out again and prefilled. The trace records how many
    chunks were dropped, the order hint and the gains, and with ``prompt.citations`` the chunks
    carry their citation numbers.

    Args:
        resources: The pipeline's resources.
        augmented: The pipeline's augmentation loop.
        request: What to answer.
        found: The retrieved or given chunks, best first.
        started: When the request started (``time.perf_counter()``), retrieval included.
    """
    retrieval_s = time.perf_counter() - started
    params = request.params
    context = _context(resources, request, found, request.conversation_chunks)
    selection: GainSelection | None = None
    if context.layout is not None and selects_by_gain(resources.config):
        selection = select_by_gain(resources, context.layout, context.chunks)
        # the kept chunks are the whole context: arranged and fitted on their own
        dropped = context.num_dropped
        context = _context(resources, request, selection.chunks, ())
        context.num_dropped += dropped
    if context.layout is None:
        prepared = no_context(retrieval_s)
    else:
        prepared = augmented.run(context.layout, context.chunks, params, started, retrieval_s)
    if context.num_dropped:
        prepared.trace = dataclasses.replace(prepared.trace, num_dropped_chunks=context.num_dropped)
    if resources.config.prompt.citations:
        prepared.chunks = numbered(prepared.chunks)
    if context.note:
        prepared.trace = dataclasses.replace(prepared.trace, order_hint=context.note)
    if selection is not None:
        reason = prepared.trace.stop_reason
        prepared.trace = dataclasses.replace(
            prepared.trace,
            stop_reason="gain" if reason == "static" else reason,
            chunk_gains=selection.gains,
            gain_s=selection.gain_s,
        )
    return prepared


def _context(
    resources: Resources,
    request: Request,
    chunks: Sequence[Chunk],
    conversation_chunks: Sequence[Chunk | str],
) -> RequestContext:
    """``chunks`` arranged and fitted for ``request`` (see :func:`request_context`)."""
    return request_context(
        resources,
        request.question,
        chunks,
        request.params,
        request.history,
        conversation_chunks,
        request.instruction,
    )
