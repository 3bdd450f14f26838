"""The engine the pipeline drives: a checkpoint, adarag's fusion loop and a decoder.

One concrete class serves both backends. The checkpoint is read once; the model is either
adarag's own :class:`~adarag.engine.model.DecoderModel` over its safetensors weights, decoded by
the same runner, or the model vLLM loaded, decoded by vLLM (``engine.backend == "vllm"``). The
fusion loop (:class:`Runner`) is the same for both.

The engine starts only its own torch backend. Any other backend is started by a
:data:`StartBackend` function the caller passes to :meth:`Engine.load`, by name
(``adarag.pipeline.backends.BACKENDS`` holds vLLM's), so the engine never imports the packages
built on it (``engine/vllm/``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import torch

from adarag.config import EngineConfig, KernelConfig, RecomputeConfig
from adarag.engine.adapter import DecoderAdapter
from adarag.engine.batch import ForwardBatch, PrefillOutput, SegmentSource, plan_segments
from adarag.engine.checkpoint import Checkpoint
from adarag.engine.context_pass import ContextPass, greedy_answers, query_over_contexts
from adarag.engine.decoding import Decoder, TorchDecoder
from adarag.engine.loader import load_model
from adarag.engine.prefill_request import LearnedControls, PrefillRequest, ResidentKV
from adarag.engine.runner import Runner
from adarag.engine.spec import ModelSpec
from adarag.engine.step_batcher import StepBatcher
from adarag.errors import ConfigError, InputError
from adarag.kernels import lens_signals_from_logits, logit_lens
from adarag.kv import ChunkKV
from adarag.schema import GenerationParams, PromptLayout

logger = logging.getLogger(__name__)

# starts a backend other than the torch engine: (checkpoint, engine config, longest prompt plus
# answer, EOS ids) -> the model's layers as the runner drives them, and the backend's decoder
StartBackend = Callable[
    [Checkpoint, EngineConfig, int, frozenset[int]], tuple[DecoderAdapter, Decoder]
]


class Engine:
    """Fused prefills, chunk KV, logit-lens signals and decoding over one loaded model.

    Example:
        >>> engine = Engine.load(EngineConfig(), KernelConfig(), home)
        >>> output = engine.prefill(PrefillRequest(layout, max_new_tokens=16))
        >>> tokens = list(engine.decode_tokens(layout, output, GenerationParams()))

    Args:
        checkpoint: The checkpoint the model was loaded from.
        model: The model's layers as the runner drives them.
        runner: The fusion loop over ``model``.
        decoder: How tokens are generated after a prefill.
        max_context_tokens: Longest prompt plus answer.
    """

    def __init__(
        self,
        checkpoint: Checkpoint,
        model: DecoderAdapter,
        runner: Runner,
        decoder: Decoder,
        max_context_tokens: int,
    ) -> None:
        self.checkpoint = checkpoint
        self.model = model
        self.runner = runner
        self.decoder = decoder
        self.max_context_tokens = max_context_tokens
        self.eos_token_ids = eos_token_ids(checkpoint)

    @classmethod
    def load(
        cls,
        engine: EngineConfig,
        kernels: KernelConfig,
        home: Path,
        backends: Mapping[str, StartBackend] | None = None,
    ) -> Engine:
        """Load ``engine.model`` on ``engine.backend``.

        Args:
            engine: The engine settings, the backend's name among them.
            kernels: The kernels' settings.
            home: Where provisioned checkpoints live.
            backends: How to start each backend other than ``"torch"``, by name
                (``adarag.pipeline.backends.load_engine`` passes them all).

        Raises:
            ConfigError: ``engine.backend`` is not ``"torch"`` and ``backends`` cannot start it.
            ModelLoadError: The checkpoint is missing or unsupported.
            MissingDependencyError: The vLLM backend is chosen but vLLM is not installed.
        """
        start_backend = None
        if engine.backend != "torch":
            start_backend = (backends or {}).get(engine.backend)
            if start_backend is None:
                raise ConfigError(
                    f"engine.backend={engine.backend!r} is started by the pipeline; load the "
                    "engine with adarag.pipeline.backends.load_engine (or through AdaRAG)"
                )
        if engine.num_threads is not None:
            # Before vLLM starts: its CPU worker then disables torch.set_num_threads.
            torch.set_num_threads(engine.num_threads)
        started = time.perf_counter()
        checkpoint = Checkpoint.open(engine.model, home)
        spec = checkpoint.spec
        max_context = engine.max_context_tokens or spec.max_position_embeddings
        model: DecoderAdapter
        decoder: Decoder
        if start_backend is not None:
            model, decoder = start_backend(
                checkpoint, engine, max_context, eos_token_ids(checkpoint)
            )
            loaded = cls(checkpoint, model, Runner(model, engine, kernels), decoder, max_context)
        else:
            model = load_model(checkpoint.path, spec, getattr(torch, engine.dtype), engine.device)
            loaded = cls.for_model(checkpoint, model, engine, kernels)
        logger.info(
            "loaded %s (%s, %d layers, %s) in %.1f s",
            checkpoint.name,
            spec.family,
            spec.num_layers,
            engine.backend,
            time.perf_counter() - started,
        )
        return loaded

    @classmethod
    def for_model(
        cls,
        checkpoint: Checkpoint,
        model: DecoderAdapter,
        engine: EngineConfig,
        kernels: KernelConfig,
    ) -> Engine:
        """The torch engine around a model already in memory.

        Benchmarks at real shapes with random weights use it: saving and re-reading the weights
        would cost more than the run.
        """
        runner = Runner(model, engine, kernels)
        batcher = StepBatcher(runner) if engine.batch_decode else None
        decoder = TorchDecoder(runner, eos_token_ids(checkpoint), batcher)
        max_context = engine.max_context_tokens or checkpoint.spec.max_position_embeddings
        return cls(checkpoint, model, runner, decoder, max_context)

    @property
    def spec(self) -> ModelSpec:
        """The model's architecture facts."""
        return self.checkpoint.spec

    @property
    def fingerprint(self) -> str:
        """Digest of the checkpoint (part of every cache key)."""
        return self.checkpoint.fingerprint

    @property
    def tokenizer(self) -> object:
        """The checkpoint's Hugging Face tokenizer."""
        return self.checkpoint.tokenizer

    def check_fits(self, layout: PromptLayout, max_new_tokens: int) -> None:
        """Raise :class:`InputError` when prompt plus answer exceed the model's context."""
        needed = layout.num_tokens + max_new_tokens
        if needed > self.max_context_tokens:
            raise InputError(
                f"the prompt has {layout.num_tokens} tokens and asks for {max_new_tokens} new "
                f"ones, {needed} in all, but the model's context is {self.max_context_tokens} "
                "tokens; use fewer or shorter chunks, or fewer new tokens"
            )

    def prefill(self, request: PrefillRequest, resident: ResidentKV | None = None) -> PrefillOutput:
        """Full or fused prefill of a laid-out prompt.

        Args:
            request: The prompt, its segments' sources, the selection rule, the learned controls
                and what to collect.
            resident: The previous augmentation step's KV cache, prefilled into when it has
                room (its leading rows hold this prompt's exact KV); None allocates a new one.

        Raises:
            InputError: The prompt does not fit the context, has no query suffix, or not one
                source per segment.
        """
        layout, controls, collect, oracle = (
            request.layout,
            request.controls,
            request.collect,
            request.oracle,
        )
        if not layout.query_ids:
            raise InputError("the prompt has no query suffix to compute")
        self.check_fits(layout, request.max_new_tokens)
        batch = ForwardBatch(
            token_ids=torch.tensor(layout.token_ids, dtype=torch.int64),
            segments=plan_segments(layout.cu_segments, _one_per_segment(layout, request.sources)),
            extra_capacity=self.decoder.reserved_rows(request.max_new_tokens)
            + max(request.min_capacity - layout.num_tokens, 0),
            collect_segment_attention=collect.segment_attention,
            num_lens_layers=min(collect.num_lens_layers, self.spec.num_layers),
            selection=request.selection or RecomputeConfig(),
            reference_kv=oracle.reference_kv,
            position_scores=oracle.position_scores,
            resident=None if resident is None else resident.kv,
            resident_rows=0 if resident is None else resident.num_rows,
            token_scorer=controls.token_scorer,
            collect_features=collect.features,
            ladder=controls.ladder,
            packet=controls.packet,
        )
        return self.runner.blend(batch)

    def compute_chunk(
        self,
        system_ids: Sequence[int],
        chunk_ids: Sequence[int],
        system_kv: ChunkKV | None = None,
        before: Sequence[tuple[Sequence[int], ChunkKV]] = (),
        packet: torch.Tensor | None = None,
    ) -> ChunkKV:
        """KV of one chunk computed after the system prefix (and ``before``), every token in full.

        Alone it is the independent tier's entry. With ``before`` (FusionRAG's offline step,
        Eq. 10) the chunk attends to those chunks' cached KV, re-rotated to consecutive positions
        after the system prefix, and its KV is returned at the positions it was computed at (a
        load re-rotates it wherever it goes).

        Args:
            system_ids: The system prefix's token ids.
            chunk_ids: The chunk's token ids (with separator).
            system_kv: Cached KV of the system prefix, reused exactly when given.
            before: Chunks placed between the system prefix and the chunk, as (token ids, cached
                KV), reused as they are.
            packet: The packet table of the packet tokens ``chunk_ids`` ends with (a trailer).
        """
        context = tuple(tuple(ids) for ids, _ in before)
        layout = PromptLayout(tuple(system_ids), context, tuple(chunk_ids))
        sources = (
            SegmentSource(system_kv, exact=True),
            *(SegmentSource(kv, 0.0) for _, kv in before),
            SegmentSource(),
        )
        output = self.prefill(
            PrefillRequest(layout, sources, controls=LearnedControls(packet=packet))
        )
        return output.kv.segment(layout.cu_segments[-2], layout.num_tokens)

    def query_over_contexts(
        self, query_ids: Sequence[int], contexts: Sequence[Sequence[ChunkKV]], reserve_rows: int = 0
    ) -> ContextPass:
        """The query's next-token logits after each cached context, in one batched pass.

        See :func:`~adarag.engine.context_pass.query_over_contexts` (nothing of a context is
        recomputed; ``reserve_rows`` leaves room to decode each context's answer).
        """
        return query_over_contexts(self.runner, query_ids, contexts, reserve_rows)

    def greedy_answers(self, passed: ContextPass, max_new_tokens: int) -> list[list[int]]:
        """Each context of ``passed``'s greedy answer, decoded in one batch (EOS left out)."""
        return greedy_answers(self.runner, passed, max_new_tokens, self.eos_token_ids)

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
        """Generated token ids after a prefill, stopping at EOS (not yielded) or the budget."""
        return self.decoder.decode_tokens(layout, output, params)

    def close(self) -> None:
        """Release the decoder's resources (shuts a vLLM engine down)."""
        self.decoder.close()


def eos_token_ids(checkpoint: Checkpoint) -> frozenset[int]:
    """The checkpoint's end-of-sequence ids (its config's and its tokenizer's)."""
    eos = set(checkpoint.spec.eos_token_ids)
    if checkpoint.tokenizer.eos_token_id is not None:
        eos.add(int(checkpoint.tokenizer.eos_token_id))
    return frozenset(eos)


def _one_per_segment(
    layout: PromptLayout, sources: Sequence[SegmentSource] | None
) -> tuple[SegmentSource, ...]:
    """``sources`` checked to be one per segment; None computes every segment."""
    if sources is None:
        return tuple(SegmentSource() for _ in layout.segments)
    if len(sources) != len(layout.segments):
        raise InputError(
            f"{len(sources)} segment sources for {len(layout.segments)} segments; pass one "
            "per segment (system prefix, each chunk, query suffix)"
        )
    return tuple(sources)
