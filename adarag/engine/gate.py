"""The blending gate: checks, for one loaded model, that reusing chunk KV is exact.

Two checks run on one prompt, against a full prefill of it:

- **re-rotation.** Every cached segment's KV is taken from the full prefill and stored as if it
  had been computed ``shift`` positions later (its keys rotated by ``+shift`` with the engine's
  own RoPE, not the kernel under test). A fused prefill at ratio 0 loads it back through the
  engine's load path, which re-rotates the keys by ``-shift``. The fused keys of every layer and
  the last token's logits must equal the full prefill's.
- **ratio one.** Every chunk's independent KV (computed after the system prefix alone) at ratio
  1.0 must give the full prefill's logits and greedy answer. On a decoder that can also compute
  the prompt on its own (vLLM's), the answer must equal that one too.
- **hand-over.** On a decoder that hands the fused KV to vLLM, vLLM must report every handed-over
  token as cached (``prompt_tokens_details.cached_tokens`` of a ``vllm serve`` replica): else
  vLLM computed the prompt itself and the equal answers above prove nothing about the fused KV
  (a replica reading another hand-over directory, holding another key, or started without
  adarag's connector).

Tolerances are relative to the largest reference value and scale with the engine's dtype.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from adarag.engine.batch import PrefillOutput, SegmentSource
from adarag.engine.core import Engine
from adarag.engine.prefill_request import PrefillRequest
from adarag.engine.rope import apply_rope, rope_cos_sin
from adarag.errors import InputError
from adarag.kv import ChunkKV
from adarag.schema import GenerationParams, PromptLayout

DEFAULT_SHIFT = 37
"""Positions by which the gate's stored chunk KV is displaced from where it is loaded."""

TOLERANCES = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}
"""Largest error, relative to the largest reference value, each KV dtype passes with."""

_BUILTIN_SYSTEM = "Answer the question from the passages."
_BUILTIN_CHUNKS = (
    "Lothair II was King of Lotharingia from 855 until his death in 869.",
    "The Seine flows through Paris, the capital of France, into the English Channel.",
)
_BUILTIN_QUESTION = "Question: which river flows through Paris? Answer:"


@dataclass(frozen=True)
class GateReport:
    """The outcome of :func:`check_blending`.

    Attributes:
        model: The checkpoint's name.
        passed: Every check passed.
        reasons: One line per failed check, naming it ("re-rotation", "ratio one").
        max_key_error: Largest absolute key difference, over all layers and prompt rows, of the
            re-rotated prompt to the full prefill.
        max_logit_error: Largest absolute last-token logit difference of the re-rotated prompt
            to the full prefill.
        ratio_one_logit_error: The same for the prefill at ratio 1.0.
        answers_equal: The greedy answer at ratio 1.0 is the full prefill's (and the decoder's
            own, where it has one).
        tolerance: The relative tolerance applied.
        shift: Positions the stored KV was displaced by.
        handed_over: Prompt tokens the ratio-1.0 request handed vLLM as fused KV, and how many
            vLLM reported cached (None: not reported); None when the decoder hands nothing over.
    """

    model: str
    passed: bool
    reasons: tuple[str, ...]
    max_key_error: float
    max_logit_error: float
    ratio_one_logit_error: float
    answers_equal: bool
    tolerance: float
    shift: int
    handed_over: tuple[int, int | None] | None = None

    def summary(self) -> str:
        """A few lines for a person: the verdict, the errors and each failed check."""
        verdict = "PASSED" if self.passed else "FAILED"
        lines = [
            f"blending gate for {self.model}: {verdict}",
            f"  re-rotation by {self.shift} positions: max key error {self.max_key_error:.3g}, "
            f"max logit error {self.max_logit_error:.3g}",
            f"  ratio 1.0 vs full prefill: max logit error {self.ratio_one_logit_error:.3g}, "
            f"answers {'equal' if self.answers_equal else 'DIFFER'}",
            f"  relative tolerance {self.tolerance:g}",
        ]
        if self.handed_over is not None:
            handed, cached = self.handed_over
            lines.append(
                f"  hand-over: {handed} prompt tokens handed to vLLM, "
                f"{'not reported' if cached is None else cached} reported cached"
            )
        return "\n".join([*lines, *(f"  failed: {reason}" for reason in self.reasons)])


def check_blending(
    engine: Engine,
    layout: PromptLayout | None = None,
    *,
    shift: int = DEFAULT_SHIFT,
    max_new_tokens: int = 8,
) -> GateReport:
    """Check that the engine's chunk-KV reuse is exact (see the module docstring).

    Args:
        engine: The loaded engine (either backend).
        layout: The prompt to check on, with at least one chunk; a small built-in one when None.
        shift: Positions by which the stored KV is displaced (nonzero).
        max_new_tokens: Length of the greedy answers compared.

    Raises:
        InputError: The layout has no chunk, or ``shift`` is zero.
    """
    layout = layout or builtin_layout(engine)
    if not layout.chunk_ids:
        raise InputError("the gate's prompt has no chunk to reuse; pass a layout with chunks")
    if shift == 0:
        raise InputError("shift=0 would not re-rotate anything; pass a nonzero shift")
    tolerance = TOLERANCES.get(engine.runner.dtype, 5e-2)
    full = engine.prefill(PrefillRequest(layout, max_new_tokens=max_new_tokens))
    reasons: list[str] = []
    key_error, logit_error = _check_rerotation(
        engine, layout, full, shift, tolerance, max_new_tokens, reasons
    )
    ratio_one_error, answers_equal, handed_over = _check_ratio_one(
        engine, layout, full, tolerance, max_new_tokens, reasons
    )
    return GateReport(
        model=engine.checkpoint.name,
        passed=not reasons,
        reasons=tuple(reasons),
        max_key_error=key_error,
        max_logit_error=logit_error,
        ratio_one_logit_error=ratio_one_error,
        answers_equal=answers_equal,
        tolerance=tolerance,
        shift=shift,
        handed_over=handed_over,
    )


def _check_rerotation(
    engine: Engine,
    layout: PromptLayout,
    full: PrefillOutput,
    shift: int,
    tolerance: float,
    max_new_tokens: int,
    reasons: list[str],
) -> tuple[float, float]:
    """KV stored ``shift`` positions away and loaded back against a full prefill.

    Returns the largest key and logit errors; why it fails goes to ``reasons``.
    """
    rerotated = engine.prefill(
        PrefillRequest(
            layout, _shifted_sources(engine, layout, full, shift), max_new_tokens=max_new_tokens
        )
    )
    rows = slice(0, layout.num_tokens)
    key_error, key_bound = _error(rerotated.kv.k[:, rows], full.kv.k[:, rows], tolerance)
    logit_error, logit_bound = _error(rerotated.logits, full.logits, tolerance)
    if key_error > key_bound or logit_error > logit_bound:
        reasons.append(
            f"re-rotation: KV stored {shift} positions away and loaded back differs from a full "
            f"prefill (max key error {key_error:.3g}, bound {key_bound:.3g}; max logit error "
            f"{logit_error:.3g}, bound {logit_bound:.3g}); the keys' RoPE re-rotation "
            "(KVCache.load, kernels.rope_delta) does not match this model's RoPE: check its "
            "rope_scaling and head layout, and serve it without reuse until it passes"
        )
    return key_error, logit_error


def _check_ratio_one(
    engine: Engine,
    layout: PromptLayout,
    full: PrefillOutput,
    tolerance: float,
    max_new_tokens: int,
    reasons: list[str],
) -> tuple[float, bool, tuple[int, int | None] | None]:
    """A fused prefill recomputing every token against a full prefill, logits and answers.

    Returns the largest logit error, whether the greedy answers are equal and what vLLM took
    of a hand-over (:func:`_handed_over`); why it fails goes to ``reasons``.
    """
    params = GenerationParams(max_new_tokens=max_new_tokens)
    ratio_one = engine.prefill(
        PrefillRequest(
            layout, _independent_sources(engine, layout, full), max_new_tokens=max_new_tokens
        )
    )
    error, bound = _error(ratio_one.logits, full.logits, tolerance)
    expected = list(engine.decode_tokens(layout, full, params))
    stream = engine.decode_tokens(layout, ratio_one, params)
    answer = list(stream)
    answers_equal = answer == expected
    alone = _decoder_alone(engine)
    if alone is not None:
        answers_equal = answers_equal and answer == list(alone(layout.token_ids, params))
    if error > bound or not answers_equal:
        reasons.append(
            "ratio one: a fused prefill recomputing every token differs from a full prefill "
            f"(max logit error {error:.3g}, bound {bound:.3g}; greedy answers "
            f"{'equal' if answers_equal else 'differ'}); the fused path does not reproduce this "
            "model's forward: serve it without reuse and report the model"
        )
    handed_over = _handed_over(engine, layout, stream, len(answer))
    if handed_over is not None and handed_over[1] != handed_over[0]:
        reasons.append(_handover_reason(*handed_over))
    return error, answers_equal, handed_over


def _handed_over(
    engine: Engine, layout: PromptLayout, stream: Iterator[int], num_answer_tokens: int
) -> tuple[int, int | None] | None:
    """Tokens a fused request handed vLLM and how many it reported cached; None: not checked.

    Not checked on a decoder that hands nothing over, nor when the answer ended at the first
    token, which is sampled from the prefill before anything is handed over.
    """
    num_handed_over = getattr(engine.decoder, "num_handed_over", None)
    handed = 0 if num_handed_over is None else int(num_handed_over(layout, num_answer_tokens))
    if handed == 0:
        return None
    return handed, getattr(stream, "num_cached_tokens", None)


def _handover_reason(num_handed: int, num_cached: int | None) -> str:
    if num_cached is None:
        return (
            f"hand-over: vLLM did not report how many of the {num_handed} handed-over prompt "
            "tokens it took from the connector; start `vllm serve` with "
            "--enable-prompt-tokens-details so the hand-over can be checked"
        )
    return (
        f"hand-over: vLLM reported {num_cached} of the {num_handed} handed-over prompt tokens "
        "cached, so it computed the prompt itself and never read the fused KV; give the front "
        "end and every replica the same hand-over (engine.vllm_handoff and the connector's "
        "kv_connector_extra_config.handoff) and the same key ($ADARAG_HANDOFF_KEY), and see "
        "the replica's log for why it refused the hand-over"
    )


def builtin_layout(engine: Engine) -> PromptLayout:
    """A short two-chunk prompt, each segment tokenized on its own without special tokens."""
    tokenizer: Any = engine.tokenizer

    def ids(text: str) -> tuple[int, ...]:
        return tuple(int(token) for token in tokenizer.encode(text, add_special_tokens=False))

    chunks = tuple(ids(" " + chunk) for chunk in _BUILTIN_CHUNKS)
    return PromptLayout(ids(_BUILTIN_SYSTEM), chunks, ids(" " + _BUILTIN_QUESTION))


def _shifted_sources(
    engine: Engine, layout: PromptLayout, full: PrefillOutput, shift: int
) -> list[SegmentSource]:
    """The exact system prefix, every cached segment stored ``shift`` positions later, at 0."""
    cu = layout.cu_segments
    sources = [_exact(full, cu[0], cu[1])]
    for start, end in zip(cu[1:-2], cu[2:-1], strict=True):
        if start == end:
            sources.append(SegmentSource())
            continue
        exact = full.kv.segment(start, end)
        sources.append(SegmentSource(_stored_at(engine, exact, start + shift), 0.0))
    return [*sources, SegmentSource()]


def _independent_sources(
    engine: Engine, layout: PromptLayout, full: PrefillOutput
) -> list[SegmentSource]:
    """The exact system prefix and every cached segment's independent KV, at ratio 1.0."""
    cu = layout.cu_segments
    system = _exact(full, cu[0], cu[1])
    sources = [
        SegmentSource(engine.compute_chunk(layout.system_ids, ids, system.cached), 1.0)
        if ids
        else SegmentSource()
        for ids in layout.cached_segments
    ]
    return [system, *sources, SegmentSource()]


def _exact(full: PrefillOutput, start: int, end: int) -> SegmentSource:
    """Rows ``start..end`` of the full prefill as an exact hit (computed when empty)."""
    if end == start:
        return SegmentSource()
    return SegmentSource(full.kv.segment(start, end), exact=True)


def _stored_at(engine: Engine, chunk: ChunkKV, position: int) -> ChunkKV:
    """``chunk`` as if computed from ``position``: keys rotated with the engine's own RoPE."""
    delta = torch.full((chunk.num_tokens,), position - chunk.start_position, dtype=torch.int64)
    runner = engine.runner
    cos, sin = rope_cos_sin(delta.to(runner.device), runner.inv_freq, chunk.k.dtype)
    keys = apply_rope(chunk.k.clone(), cos, sin)
    return ChunkKV(keys, chunk.v.clone(), position)


def _error(actual: torch.Tensor, expected: torch.Tensor, tolerance: float) -> tuple[float, float]:
    """The largest absolute difference, and the bound: ``tolerance`` times the largest value."""
    expected = expected.float()
    error = float((actual.float() - expected).abs().max())
    return error, tolerance * max(float(expected.abs().max()), 1.0)


def _decoder_alone(
    engine: Engine,
) -> Callable[[Sequence[int], GenerationParams], list[int]] | None:
    """The decoder computing a prompt on its own (vLLM's), or None when it cannot."""
    generate = getattr(engine.decoder, "generate", None)
    if generate is None:
        return None

    def alone(token_ids: Sequence[int], params: GenerationParams) -> list[int]:
        # a fresh cache salt: vLLM computes the whole prompt, with no prefix-cache hit
        return list(generate(token_ids, params, cache_salt=uuid.uuid4().hex))

    return alone
