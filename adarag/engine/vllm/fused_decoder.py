"""What the two vLLM decoders share: handing vLLM a prompt's fused KV, and the token stream back.

Both hand the fused KV over under a fresh handoff id, and both fall back to vLLM computing the
whole prompt once the blending gate refused the model. They differ in how the KV and the prompt
reach vLLM: :class:`~adarag.engine.vllm.decoder.VLLMDecoder` (vLLM in this process) and
:class:`~adarag.engine.vllm.server_decoder.VLLMServerDecoder` (``vllm serve`` replicas), and in
who picks the first token:

- in process, vLLM gets the KV of every prompt token but the last and computes the last one
  to get the first token's logits;
- on a server, the first token is sampled here from the prefill's own logits and streamed at
  once, the way a disaggregated prefill instance returns it; the server gets the KV of the whole
  prompt, computes the first token's KV and decodes on. Time to the first token is the prefill's,
  not the prefill's plus a hand-over and a trip through the server's queue.

No vLLM import: the server decoder's front end runs without vLLM.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Generator, Iterator, Sequence
from contextlib import closing
from typing import Protocol

from adarag.engine.batch import PrefillOutput
from adarag.engine.sampler import make_rng, sample_token
from adarag.engine.vllm.handoff import FusedContext, HandoffRequest
from adarag.errors import InputError
from adarag.schema import GenerationParams, PromptLayout


class PromptReport(Protocol):
    """What vLLM reported about a request's prompt, filled in while its tokens stream."""

    @property
    def num_cached_tokens(self) -> int | None:
        """Prompt tokens vLLM did not compute (its prefix-cache hit plus the connector's)."""
        ...


class TokenStream(Iterator[int]):
    """Generated token ids of one vLLM request, and what was reported about its prompt.

    Closing the stream (or dropping it) ends an unfinished request in vLLM and releases the
    fused KV handed over for it.
    """

    def __init__(self, tokens: Generator[int, None, None], report: PromptReport) -> None:
        self._tokens = tokens
        self._report = report

    def __next__(self) -> int:
        return next(self._tokens)

    def close(self) -> None:
        """Stop early."""
        self._tokens.close()

    @property
    def num_cached_tokens(self) -> int | None:
        """Prompt tokens vLLM did not compute, its prefix-cache hit plus the connector's.

        None while (or where) vLLM has not reported it.
        """
        return self._report.num_cached_tokens


class _ContinuationReport:
    """What vLLM reported about the prompt of the request that continues the first token."""

    def __init__(self) -> None:
        self.continuation: TokenStream | None = None

    @property
    def num_cached_tokens(self) -> int | None:
        """None until the continuation's prompt was reported (and when the answer needed none)."""
        return None if self.continuation is None else self.continuation.num_cached_tokens


class FusedKVDecoder(ABC):
    """Decoding by vLLM fed adarag's fused KV; subclasses say how it reaches vLLM."""

    eos_token_ids: frozenset[int]
    """Tokens that end an answer."""

    blending_refused: str | None = None
    """Why the blending gate refused the model; None while fused KV is handed over."""

    first_token_from_prefill: bool = False
    """Sample the first token here from the prefill's logits (module docstring)."""

    def reserved_rows(self, max_new_tokens: int) -> int:
        """None: vLLM decodes into its own paged blocks."""
        return 0

    def num_handed_over(self, layout: PromptLayout, num_answer_tokens: int) -> int:
        """Prompt tokens whose fused KV a request of ``layout`` handed vLLM (all it may skip).

        Args:
            layout: The prompt.
            num_answer_tokens: Tokens the request's answer had (none is handed over when the
                first token, sampled from the prefill, ended it).
        """
        if not self.first_token_from_prefill:
            return layout.num_tokens - 1
        return layout.num_tokens if num_answer_tokens > 1 else 0

    def decode_tokens(
        self, layout: PromptLayout, output: PrefillOutput, params: GenerationParams
    ) -> TokenStream:
        """Generated token ids from vLLM, fed the prompt's fused KV.

        Args:
            layout: The prompt the prefill computed.
            output: The prefill; rows ``0..n-2`` of ``output.kv`` go to vLLM as computed (all
                ``n`` rows and the first token after ``output.logits`` with
                ``first_token_from_prefill``).
            params: Decoding options (vLLM samples).
        """
        if self.blending_refused is not None:  # the blending gate failed: vLLM computes it
            return self.generate(layout.token_ids, params)
        if self.first_token_from_prefill:
            report = _ContinuationReport()
            return TokenStream(self._after_first_token(layout, output, params, report), report)
        return self._fused(layout.token_ids, output, layout.num_tokens - 1, params)

    def _fused(
        self,
        token_ids: Sequence[int],
        output: PrefillOutput,
        num_context: int,
        params: GenerationParams,
    ) -> TokenStream:
        """The answer vLLM streams for ``token_ids``, fed the first ``num_context`` KV rows."""
        assert output.kv.length >= num_context, f"prefill has {output.kv.length} rows"
        handoff = HandoffRequest(uuid.uuid4().hex, num_context)
        context = FusedContext(output.kv.k[:, :num_context], output.kv.v[:, :num_context])
        return self._decode_fused(token_ids, params, handoff, context)

    def _after_first_token(
        self,
        layout: PromptLayout,
        output: PrefillOutput,
        params: GenerationParams,
        report: _ContinuationReport,
    ) -> Generator[int, None, None]:
        """The first token sampled from the prefill, then vLLM's continuation of it.

        The hand-over is written only once the first token is out (and not at all when the
        answer ends there), so it never delays the first token.
        """
        first = sample_token(output.logits, params, make_rng(params))
        if first in self.eos_token_ids:
            return
        yield first
        if params.max_new_tokens == 1:
            return
        rest = params.model_copy(update={"max_new_tokens": params.max_new_tokens - 1})
        prompt = [*layout.token_ids, first]
        report.continuation = self._fused(prompt, output, layout.num_tokens, rest)
        with closing(report.continuation) as continuation:  # ends vLLM's request if dropped
            yield from continuation

    def refuse_blending(self, reason: str) -> None:
        """Hand no fused KV over from now on: vLLM computes every prompt (``reason`` kept)."""
        self.blending_refused = reason

    def generate(
        self, token_ids: Sequence[int], params: GenerationParams, cache_salt: str | None = None
    ) -> TokenStream:
        """Plain vLLM generation: vLLM computes the whole prompt (or reuses its prefix cache).

        Args:
            token_ids: The prompt.
            params: Decoding options.
            cache_salt: Keeps the request's prefix-cache blocks apart from other salts'.

        Raises:
            InputError: The prompt is empty.
        """
        if not token_ids:
            raise InputError("the prompt is empty; pass at least one token id")
        return self._generate(token_ids, params, cache_salt)

    @abstractmethod
    def _decode_fused(
        self,
        token_ids: Sequence[int],
        params: GenerationParams,
        handoff: HandoffRequest,
        context: FusedContext,
    ) -> TokenStream:
        """Hand ``context`` to vLLM under ``handoff`` and stream the prompt's answer.

        The request carries a cache salt of its own (the handoff id): vLLM's prefix cache never
        serves blocks of fused KV to another prompt.
        """

    @abstractmethod
    def _generate(
        self, token_ids: Sequence[int], params: GenerationParams, cache_salt: str | None
    ) -> TokenStream:
        """Stream the answer vLLM computes for the whole prompt."""
