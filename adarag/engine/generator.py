"""The torch-engine generator: prompt layouts, chunk KV, fused prefill and streaming decode."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from adarag.cache.entry import ChunkKV
from adarag.config import AdaRagConfig
from adarag.engine.batch import ForwardBatch, PrefillOutput, SegmentSource, plan_segments
from adarag.engine.detokenizer import StreamingDetokenizer
from adarag.engine.loader import load_model, resolve_checkpoint
from adarag.engine.model import DecoderModel
from adarag.engine.prompt import PromptBuilder, load_tokenizer
from adarag.engine.runner import Runner
from adarag.engine.sampler import make_generator, sample_token
from adarag.engine.spec import ModelSpec, model_fingerprint, read_hf_config
from adarag.errors import InputError
from adarag.kernels import logit_lens
from adarag.schema import GenerationParams, PromptLayout

logger = logging.getLogger(__name__)


class TorchGenerator:
    """adarag's own engine: runs a Hugging Face checkpoint layer by layer on torch.

    Example:
        >>> generator = TorchGenerator(AdaRagConfig())
        >>> layout = generator.layout("Who wrote Hamlet?", ["Hamlet is a play by Shakespeare."])
        >>> output = generator.prefill(layout, max_new_tokens=16)
        >>> "".join(generator.stream(layout, output, GenerationParams(max_new_tokens=16)))
    """

    def __init__(self, config: AdaRagConfig) -> None:
        engine_config = config.engine
        if engine_config.num_threads is not None:
            torch.set_num_threads(engine_config.num_threads)
        started = time.perf_counter()
        self.checkpoint: Path = resolve_checkpoint(engine_config.model, config.home)
        self.spec = ModelSpec.from_hf_config(read_hf_config(self.checkpoint))
        self.fingerprint = model_fingerprint(self.checkpoint)
        self.model: DecoderModel = load_model(
            self.checkpoint, self.spec, getattr(torch, engine_config.dtype), engine_config.device
        )
        self.tokenizer = load_tokenizer(self.checkpoint)
        self.prompts = PromptBuilder(self.tokenizer, config.prompt)
        self.runner = Runner(self.model, engine_config, config.kernels, config.cache.recompute)
        self.max_context_tokens = (
            engine_config.max_context_tokens or self.spec.max_position_embeddings
        )
        eos = set(self.spec.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            eos.add(int(self.tokenizer.eos_token_id))
        self.eos_token_ids = frozenset(eos)
        logger.info(
            "loaded %s (%s, %d layers) in %.1f s",
            self.checkpoint.name,
            self.spec.family,
            self.spec.num_layers,
            time.perf_counter() - started,
        )

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
    ) -> PrefillOutput:
        """Full or fused prefill of a laid-out prompt.

        Args:
            layout: The prompt's segments.
            sources: One per segment (system, chunks..., query); None computes everything.
            max_new_tokens: KV rows to reserve for decoding.
            collect_segment_attention: Also return chunk-granularity attention per layer.

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
            extra_capacity=max_new_tokens,
            collect_segment_attention=collect_segment_attention,
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

    @torch.inference_mode()
    def lens_signals(
        self, output: PrefillOutput, num_lens_layers: int
    ) -> tuple[list[float], float]:
        """Logit-lens KL of each of the last ``l - 1`` layers to the final one, and the entropy."""
        hidden = output.layer_hidden[-num_lens_layers:]
        kl, entropy = logit_lens(
            hidden,
            self.model.final_norm_weight,
            self.spec.rms_norm_eps,
            self.model.lm_head_weight,
            backend=self.runner.backend,
        )
        return [float(x) for x in kl], float(entropy)

    def decode_tokens(
        self, layout: PromptLayout, output: PrefillOutput, params: GenerationParams
    ) -> Iterator[int]:
        """Yield generated token ids after a prefill, stopping at EOS or ``max_new_tokens``.

        Decoding writes after the prompt's rows of ``output.kv``; the same prefill can be decoded
        again (its prompt rows are never changed).
        """
        kv = output.kv
        kv.length = layout.num_tokens
        budget = min(params.max_new_tokens, kv.capacity - kv.length + 1)
        generator = make_generator(params)
        logits = output.logits
        for step in range(budget):
            token = sample_token(logits, params, generator)
            if token in self.eos_token_ids:
                return
            yield token
            if step + 1 < budget:
                logits = self.runner.decode(token, kv)

    def stream(
        self, layout: PromptLayout, output: PrefillOutput, params: GenerationParams
    ) -> Iterator[str]:
        """Yield answer text deltas, honouring stop strings."""
        detokenizer = StreamingDetokenizer(self.tokenizer, params.stop)
        for token in self.decode_tokens(layout, output, params):
            delta = detokenizer.push(token)
            if delta:
                yield delta
            if detokenizer.stopped:
                return
        tail = detokenizer.flush()
        if tail:
            yield tail
