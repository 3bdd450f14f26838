"""Decoding after a fused prefill: the interface an engine's decoder implements, and torch's.

The torch engine decodes with adarag's own runner into the prefill's KV; the vLLM backend
(``adarag.engine.vllm.decoder``) hands the fused KV to vLLM, which decodes, samples and batches.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

from adarag.engine.batch import PrefillOutput
from adarag.engine.runner import Runner
from adarag.engine.sampler import make_rng, sample_token
from adarag.engine.step_batcher import StepBatcher
from adarag.schema import GenerationParams, PromptLayout


class Decoder(Protocol):
    """Generates token ids after a prefill."""

    def reserved_rows(self, max_new_tokens: int) -> int:
        """KV rows a prefill reserves after the prompt for this decoder."""
        ...

    def decode_tokens(
        self, layout: PromptLayout, output: PrefillOutput, params: GenerationParams
    ) -> Iterator[int]:
        """Generated token ids, stopping at EOS (not yielded) or ``max_new_tokens``."""
        ...

    def close(self) -> None:
        """Release what the decoder holds (a vLLM engine); a no-op for torch."""
        ...


class TorchDecoder:
    """Decodes with adarag's runner into the rows after the prompt in the prefill's KV.

    Args:
        runner: The fusion loop over the model's layers.
        eos_token_ids: Tokens that end an answer.
    """

    def __init__(
        self, runner: Runner, eos_token_ids: frozenset[int], batcher: StepBatcher | None = None
    ) -> None:
        self.runner = runner
        self.eos_token_ids = eos_token_ids
        self.batcher = batcher

    def reserved_rows(self, max_new_tokens: int) -> int:
        """One row per new token."""
        return max_new_tokens

    def decode_tokens(
        self, layout: PromptLayout, output: PrefillOutput, params: GenerationParams
    ) -> Iterator[int]:
        """Yield generated token ids after a prefill, stopping at EOS or ``max_new_tokens``.

        Decoding writes after the prompt's rows of ``output.kv``; the same prefill can be decoded
        again (its prompt rows are never changed).
        """
        kv = output.kv
        budget = _start(layout, output, params)
        rng = make_rng(params)
        logits = output.logits
        batcher = self.batcher
        if batcher is not None:
            batcher.begin()
        try:
            for step in range(budget):
                token = sample_token(logits, params, rng)
                if token in self.eos_token_ids:
                    return
                yield token
                if step + 1 < budget:
                    if batcher is None:
                        logits = self.runner.decode(token, kv)
                    else:  # stepped together with the other requests decoding now
                        logits = batcher.step(token, kv)
        finally:
            if batcher is not None:
                batcher.end()

    def decode_batch(
        self,
        layouts: Sequence[PromptLayout],
        outputs: Sequence[PrefillOutput],
        params: GenerationParams,
    ) -> list[list[int]]:
        """Decode several prefilled prompts together, one step of all of them at a time.

        Each sequence gets the tokens :meth:`decode_tokens` would give it alone (its own sampler,
        EOS and budget); a finished sequence leaves the batch. One step multiplies the weights
        once for every live sequence, so several streams cost little more than one.
        """
        assert len(layouts) == len(outputs), "one layout per prefill"
        live = []
        for index, (layout, output) in enumerate(zip(layouts, outputs, strict=True)):
            budget = _start(layout, output, params)
            live.append((index, output.kv, budget, make_rng(params), output.logits))
        tokens: list[list[int]] = [[] for _ in layouts]
        while live:
            stepping = []
            for index, kv, budget, rng, logits in live:
                token = sample_token(logits, params, rng)
                if token in self.eos_token_ids:
                    continue
                tokens[index].append(token)
                if len(tokens[index]) < budget:
                    stepping.append((index, kv, budget, rng, token))
            if not stepping:
                break
            step_logits = self.runner.decode_batch(
                [token for *_, token in stepping], [kv for _, kv, *_ in stepping]
            )
            live = [
                (index, kv, budget, rng, step_logits[row])
                for row, (index, kv, budget, rng, _) in enumerate(stepping)
            ]
        return tokens

    def close(self) -> None:
        """Nothing to release."""


def _start(layout: PromptLayout, output: PrefillOutput, params: GenerationParams) -> int:
    """Rewind the prefill's KV to the prompt; the most tokens it can decode (room and budget)."""
    kv = output.kv
    kv.length = layout.num_tokens
    return min(params.max_new_tokens, kv.capacity - kv.length + 1)
