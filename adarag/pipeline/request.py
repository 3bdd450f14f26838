"""One request prepared for decoding: its context laid out, its prefills run, its trace noted."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

from adarag.pipeline.context import numbered, request_context
from adarag.pipeline.prompt import Turn
from adarag.pipeline.resources import Resources
from adarag.pipeline.steps import AugmentedPrefill
from adarag.pipeline.stream import PreparedAnswer, no_context
from adarag.schema import Chunk, GenerationParams


def prepare_answer(
    resources: Resources,
    augmented: Callable[[], AugmentedPrefill],
    question: str,
    found: Sequence[Chunk],
    params: GenerationParams,
    history: Sequence[Turn],
    conversation_chunks: Sequence[Chunk | str],
    started: float,
) -> PreparedAnswer:
    """The answer to ``question`` from ``found``, prefilled and ready to decode.

    The chunks are arranged and fitted to the model's context; without any chunk the answer is
    the no-context one. The trace records how many chunks were dropped and the order hint, and
    with ``prompt.citations`` the chunks carry their citation numbers.

    Args:
        resources: The pipeline's resources.
        augmented: Builds the augmentation loop (called only when there is a context).
        question: What to answer (checked already).
        found: The retrieved or given chunks, best first.
        params: Decoding options.
        history: Earlier turns of the conversation to carry.
        conversation_chunks: The conversation's context so far, in listed order.
        started: When the request started (``time.perf_counter()``), retrieval included.
    """
    retrieval_s = time.perf_counter() - started
    context = request_context(resources, question, found, params, history, conversation_chunks)
    if context.layout is None:
        prepared = no_context(retrieval_s)
    else:
        prepared = augmented().run(context.layout, context.chunks, params, started, retrieval_s)
    if context.num_dropped:
        prepared.trace = dataclasses.replace(prepared.trace, num_dropped_chunks=context.num_dropped)
    if resources.config.prompt.citations:
        prepared.chunks = numbered(prepared.chunks)
    if context.note:
        prepared.trace = dataclasses.replace(prepared.trace, order_hint=context.note)
    return prepared
