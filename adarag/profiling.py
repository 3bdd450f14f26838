"""Attention-sink profiling: run prompts with full attention and build a :class:`ModelProfile`."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

import torch

from adarag.cache.profile import ModelProfile, analyse_chunk_attention, bands_of
from adarag.engine.interface import Generator

logger = logging.getLogger(__name__)


def chunk_attention(
    generator: Generator, prompts: Iterable[tuple[str, Sequence[str]]], num_chunks: int
) -> tuple[torch.Tensor, int]:
    """Mean chunk-granularity attention over prompts with exactly ``num_chunks`` chunks each.

    Returns:
        ``([num_layers, num_chunks + 2, num_chunks + 2] mean attention, number of prompts)``.
    """
    total: torch.Tensor | None = None
    count = 0
    for question, chunks in prompts:
        if len(chunks) != num_chunks:
            continue
        layout = generator.layout(question, chunks)
        output = generator.prefill(layout, collect_segment_attention=True)
        assert output.segment_attention is not None
        total = output.segment_attention if total is None else total + output.segment_attention
        count += 1
        logger.info("profiled prompt %d (%d tokens)", count, layout.num_tokens)
    if total is None:
        raise ValueError(f"no prompt had {num_chunks} chunks to profile")
    return total / count, count


def build_profile(
    generator: Generator, attention: torch.Tensor, num_prompts: int, model_name: str
) -> ModelProfile:
    """Analyse mean chunk attention into a profile of ``generator``'s model."""
    patterns, predecessor, sink, sink_chunk = analyse_chunk_attention(attention)
    bands = bands_of(patterns)
    transition = bands[1].start if len(bands) > 1 else None
    return ModelProfile(
        model=model_name,
        fingerprint=generator.fingerprint,
        num_layers=attention.shape[0],
        transition_layer=transition,
        sink_chunk_idx=sink_chunk,
        bands=bands,
        predecessor_share=tuple(round(x, 4) for x in predecessor),
        sink_share=tuple(round(x, 4) for x in sink),
        num_prompts=num_prompts,
        num_chunks=attention.shape[1] - 2,
        chunk_attention=tuple(
            tuple(tuple(round(float(x), 4) for x in row) for row in layer) for layer in attention
        ),
    )
