"""What every generator shares: prompt layout, adarag's fused prefill, chunk KV, logit-lens signals.

A generator subclass supplies the model (a :class:`DecoderAdapter` over weights it loaded) and
the way it decodes from a prefill; the fusion loop (:class:`Runner`) is the same for all of them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from adarag.cache.entry import ChunkKV
from adarag.config import AdaRagConfig
from adarag.engine.adapter import DecoderAdapter
from adarag.engine.batch import ForwardBatch, PrefillOutput, SegmentSource, plan_segments
from adarag.engine.detokenizer import StreamingDetokenizer
from adarag.engine.prompt import PromptBuilder
from adarag.engine.runner import Runner
from adarag.engine.spec import ModelSpec
from adarag.errors import InputError
from adarag.kernels import lens_signals_from_logits, logit_lens
from adarag.schema import GenerationParams, PromptLayout


class FusionGenerator:
    """Runs adarag's fusion loop over a model adapter; subclasses add decoding.

    Args:
        config: The root configuration.
        checkpoint: The checkpoint directory the model was loaded from.
        spec: The model's architecture facts.
        fingerprint: Digest of the checkpoint (part of every cache key).
        model: The model's layers as the runner drives them.
        tokenizer: The checkpoint's Hugging Face tokenizer.
    """

    def __init__(
        self,
        config: AdaRagConfig,
        checkpoint: Path,
        spec: ModelSpec,
        fingerprint: str,
        model: DecoderAdapter,
        tokenizer: Any,
    ) -> None:
        self.checkpoint = checkpoint
        self.spec = spec
        self.fingerprint = fingerprint
        self.model = model
        self.tokenizer = tokenizer
        self.prompts = PromptBuilder(tokenizer, config.prompt)
        self.runner = Runner(model, config.engine, config.kernels, config.cache.recompute)
        self.max_context_tokens = config.engine.max_context_tokens or spec.max_position_embeddings
        eos = set(spec.eos_token_ids)
        if tokenizer.eos_token_id is not None:
            eos.add(int(tokenizer.eos_token_id))
        self.eos_token_ids = frozenset(eos)

    def layout(self, question: str, chunks: Sequence[str]) -> PromptLayout:
        """Lay out ``system + chunks + question`` as token segments (see :class:`PromptBuilder`)."""
        return self.prompts.layout(question, chunks)

    def check_fits(self, layout: PromptLayout, max_new_tokens: int) -> None:
        """Raise :class:`InputError` when prompt plus answer exceed the model's context."""
        needed = layout.num_tokens + max_new_tokens
        if needed > self.max_context_tokens:
            raise InputError(
                f"the prompt has {layout.num_tokens} tokens and asks for {max_new_tokens} new "
                f"ones, {needed} in all, but the model's context is {self.max_context_tokens} "
                "tokens; use fewer or shorter chunks, or fewer new tokens"
            )

    def prefill(
        self,
        layout: PromptLayout,
        sources: Sequence[SegmentSource] | None = None,
        *,
        max_new_tokens: int = 0,
        collect_segment_attention: bool = False,
        num_lens_layers: int = 1,
    ) -> PrefillOutput:
        """Full or fused prefill of a laid-out prompt.

        Args:
            layout: The prompt's segments.
            sources: One per segment (system, chunks..., query); None computes everything.
            max_new_tokens: Tokens the answer may take (checked against the context).
            collect_segment_attention: Also return chunk-granularity attention per layer.
            num_lens_layers: Also return the logit-lens logits of this many last layers, so that
                :meth:`lens_signals` only reduces them.

        Raises:
            InputError: The prompt does not fit the context, or has no query suffix.
        """
        if not layout.query_ids:
            raise InputError("the prompt has no query suffix to compute")
        self.check_fits(layout, max_new_tokens)
        if sources is None:
            sources = tuple(SegmentSource() for _ in layout.segments)
        if len(sources) != len(layout.segments):
            raise InputError(
                f"{len(sources)} segment sources for {len(layout.segments)} segments; pass one "
                "per segment (system prefix, each chunk, query suffix)"
            )
        batch = ForwardBatch(
            token_ids=torch.tensor(layout.token_ids, dtype=torch.int64),
            segments=plan_segments(layout.cu_segments, tuple(sources)),
            extra_capacity=self._decode_rows(max_new_tokens),
            collect_segment_attention=collect_segment_attention,
            num_lens_layers=min(num_lens_layers, self.spec.num_layers),
        )
        return self.runner.blend(batch)

    def compute_chunk(self, chunk_ids: Sequence[int], system_kv: ChunkKV | None = None) -> ChunkKV:
        """KV of one chunk computed alone after the system prefix (the independent tier's entry).

        Args:
            chunk_ids: The chunk's token ids (with separator).
            system_kv: Cached KV of the system prefix, reused exactly when given.
        """
        system_ids = self.prompts.system_ids
        layout = PromptLayout(system_ids, (), tuple(chunk_ids))
        sources = (SegmentSource(system_kv), SegmentSource())
        output = self.prefill(layout, sources)
        return output.kv.segment(len(system_ids), layout.num_tokens)

    def lens_signals(
        self, output: PrefillOutput, num_lens_layers: int
    ) -> tuple[list[float], float]:
        """Logit-lens KL of each of the last ``l - 1`` layers to the final one, and the entropy.

        Reduces the prefill's ``lens_logits`` when it computed enough layers; otherwise projects
        the last layers' hidden states through the LM head first (the fused kernel on CUDA).
        """
        lens_logits = output.lens_logits
        with torch.inference_mode():
            if lens_logits is not None and lens_logits.shape[0] >= num_lens_layers:
                kl, entropy = lens_signals_from_logits(lens_logits[-num_lens_layers:])
                return [float(x) for x in kl], float(entropy)
            kl, entropy = logit_lens(
                output.layer_hidden[-num_lens_layers:],
                self.model.final_norm_weight,
                self.spec.rms_norm_eps,
                self.model.lm_head_weight,
                backend=self.runner.backend,
            )
        return [float(x) for x in kl], float(entropy)

    def decode_tokens(
        self, layout: PromptLayout, output: PrefillOutput, params: GenerationParams
    ) -> Iterator[int]:
        """Yield generated token ids after a prefill, stopping at EOS or ``max_new_tokens``."""
        raise NotImplementedError

    def stream(
        self, layout: PromptLayout, output: PrefillOutput, params: GenerationParams
    ) -> Iterator[str]:
        """Yield answer text deltas, honouring stop strings."""
        detokenizer = StreamingDetokenizer(self.tokenizer, params.stop)
        tokens = self.decode_tokens(layout, output, params)
        try:
            for token in tokens:
                delta = detokenizer.push(token)
                if delta:
                    yield delta
                if detokenizer.stopped:
                    return
        finally:
            close = getattr(tokens, "close", None)
            if close is not None:
                close()  # ends a backend request the caller stopped early
        tail = detokenizer.flush()
        if tail:
            yield tail

    def _decode_rows(self, max_new_tokens: int) -> int:
        """KV rows a prefill reserves after the prompt for decoding."""
        return max_new_tokens
