"""Decoding glue: a prepared answer's text deltas, its decode steps counted and locked.

Without ``engine.batch_decode`` each decode step takes the engine lock, so concurrent requests
interleave step by step; with it the steps take none and meet in the decoder's batcher. Tokens
streamed from a remote server (a decoder with ``remote = True``) take no lock either.
:func:`plain_answer` prefills a plain prompt (no retrieval, no chunk KV) for ``AdaRAG.generate``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence

from adarag.engine.core import Engine
from adarag.engine.prefill_request import PrefillRequest
from adarag.errors import InputError
from adarag.pipeline.answer_stream import (
    NO_CONTEXT_ANSWER,
    AnswerStream,
    PreparedAnswer,
    TokenCount,
    decode_text,
)
from adarag.pipeline.prompt import PromptBuilder
from adarag.schema import GenerationParams, PromptLayout, QueryTrace, StepTrace


def answer_stream(
    engine: Engine, engine_lock: threading.RLock, prepared: PreparedAnswer, params: GenerationParams
) -> AnswerStream:
    """The stream of ``prepared``'s answer decoded with ``params`` (or the no-context answer)."""
    counter = TokenCount()
    if prepared.output is None:
        deltas: Iterator[str] = iter([NO_CONTEXT_ANSWER])
    else:
        deltas = decode_steps(engine, engine_lock, prepared, params, counter)
    return AnswerStream(prepared, deltas, counter)


def decode_steps(
    engine: Engine,
    engine_lock: threading.RLock,
    prepared: PreparedAnswer,
    params: GenerationParams,
    counter: TokenCount,
) -> Iterator[str]:
    """Answer deltas, taking the engine lock for each decode step only.

    With ``engine.batch_decode`` the steps take no engine lock: they only touch this
    request's KV and the read-only model, and concurrent requests' steps must reach the
    decoder's batcher together to be batched.

    The write-back is the :class:`AnswerStream`'s to run when it ends or is closed, never
    this engine's: an engine dropped unfinished is closed wherever the garbage collector
    runs, where taking the engine lock could deadlock.
    """
    assert prepared.layout is not None and prepared.output is not None
    tokens = engine.decode_tokens(prepared.layout, prepared.output, params)
    decoder = engine.decoder
    if getattr(decoder, "batcher", None) is None and not getattr(decoder, "remote", False):
        steps = locked_steps(tokens, engine_lock, counter)
    else:  # batched steps meet in the batcher; a remote server's tokens need no engine
        steps = counted_steps(tokens, counter)
    try:
        yield from decode_text(steps, engine.tokenizer, params)
    finally:
        close = getattr(tokens, "close", None)
        if close is not None:
            close()  # ends a backend request the caller stopped early


def locked_steps(
    tokens: Iterator[int], engine_lock: threading.RLock, counter: TokenCount
) -> Iterator[int]:
    """``tokens``, each produced under the engine lock, counted in ``counter``."""
    while True:
        with engine_lock:
            token = next(tokens, None)
        if token is None:
            return
        counter.value += 1
        yield token


def counted_steps(tokens: Iterator[int], counter: TokenCount) -> Iterator[int]:
    """``tokens``, counted in ``counter``."""
    for token in tokens:
        counter.value += 1
        yield token


def plain_answer(
    engine: Engine,
    engine_lock: threading.RLock,
    prompts: PromptBuilder,
    prompt: str | Sequence[Mapping[str, str]],
    params: GenerationParams,
    started: float,
) -> PreparedAnswer:
    """``prompt`` prefilled now (text in the model's format, or chat messages), with its trace.

    Raises:
        InputError: The prompt is empty or does not fit the context.
    """
    if isinstance(prompt, str):
        if not prompt.strip():
            raise InputError("the prompt is empty; pass a non-empty prompt")
        ids = prompts.text_ids(prompt)
    else:
        ids = prompts.chat_ids(prompt)
    layout = PromptLayout((), (), ids)
    with engine_lock:
        output = engine.prefill(PrefillRequest(layout, max_new_tokens=params.max_new_tokens))
    prefill_s = time.perf_counter() - started
    step = StepTrace(
        num_chunks=0,
        confidence=None,
        kl_score=None,
        entropy_score=None,
        num_processed_tokens=output.num_processed_tokens,
        num_recomputed_tokens=output.num_recomputed_tokens,
        tiers=(),
        prefill_s=prefill_s,
        confidence_s=0.0,
    )
    trace = QueryTrace(
        steps=(step,), stop_reason="static", ttft_s=prefill_s, num_prompt_tokens=len(ids)
    )
    return PreparedAnswer(layout, output, (), trace, 0)
