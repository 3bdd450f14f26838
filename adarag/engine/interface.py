"""The generator interface the pipeline drives; the torch and vLLM backends both implement it.

A generator lays prompts out as token segments, runs fused prefills (adarag's fusion loop over the
backend's own layers), computes chunk KV, reads logit-lens signals, and decodes from a prefill.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol

from adarag.cache.entry import ChunkKV
from adarag.config import AdaRagConfig
from adarag.engine.batch import PrefillOutput, SegmentSource
from adarag.engine.prompt import PromptBuilder
from adarag.engine.spec import ModelSpec
from adarag.schema import GenerationParams, PromptLayout


class Generator(Protocol):
    """What :class:`adarag.pipeline.AdaRAG` needs from a backend."""

    spec: ModelSpec
    checkpoint: Path
    fingerprint: str
    prompts: PromptBuilder
    eos_token_ids: frozenset[int]

    def layout(self, question: str, chunks: Sequence[str]) -> PromptLayout:
        """Lay out ``system + chunks + question`` as token segments."""
        ...

    def check_fits(self, layout: PromptLayout, max_new_tokens: int) -> None:
        """Raise when prompt plus answer exceed the context."""
        ...

    def prefill(
        self,
        layout: PromptLayout,
        sources: Sequence[SegmentSource] | None = None,
        *,
        max_new_tokens: int = 0,
        collect_segment_attention: bool = False,
        num_lens_layers: int = 1,
    ) -> PrefillOutput:
        """Full or fused prefill (one source per segment; None computes everything)."""
        ...

    def compute_chunk(self, chunk_ids: Sequence[int], system_kv: ChunkKV | None = None) -> ChunkKV:
        """KV of one chunk computed alone after the system prefix."""
        ...

    def lens_signals(
        self, output: PrefillOutput, num_lens_layers: int
    ) -> tuple[list[float], float]:
        """Logit-lens KL of the last layers to the final one, and the final entropy."""
        ...

    def decode_tokens(
        self, layout: PromptLayout, output: PrefillOutput, params: GenerationParams
    ) -> Iterator[int]:
        """Generated token ids after a prefill."""
        ...

    def stream(
        self, layout: PromptLayout, output: PrefillOutput, params: GenerationParams
    ) -> Iterator[str]:
        """Answer text deltas after a prefill."""
        ...


def create_generator(config: AdaRagConfig) -> Generator:
    """The generator for ``config.engine.backend`` (vLLM is imported only when chosen)."""
    if config.engine.backend == "vllm":
        from adarag.engine.vllm import VLLMGenerator

        return VLLMGenerator(config)
    from adarag.engine.generator import TorchGenerator

    return TorchGenerator(config)
