"""Builders shared by the engine tests."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from adarag.cache.entry import ChunkKV
from adarag.engine.batch import PrefillOutput, SegmentSource
from adarag.engine.generator import TorchGenerator
from adarag.schema import PromptLayout

CHUNKS = (
    "paris is the capital of france and the seine runs through it.",
    "berlin is the capital of germany; the spree runs through berlin.",
    "the quick brown fox jumps over the lazy dog near the river.",
)
QUESTION = "what is the capital of france?"


def independent_sources(
    generator: TorchGenerator, layout: PromptLayout, ratio: float
) -> tuple[list[SegmentSource], list[ChunkKV], ChunkKV]:
    """Sources that reuse the exact system KV and each chunk's independent KV at ``ratio``."""
    system_kv = system_prefix_kv(generator, layout)
    chunk_kvs = [generator.compute_chunk(ids, system_kv) for ids in layout.chunk_ids]
    sources = [SegmentSource(system_kv)]
    sources += [SegmentSource(kv, ratio) for kv in chunk_kvs]
    sources.append(SegmentSource())
    return sources, chunk_kvs, system_kv


def system_prefix_kv(generator: TorchGenerator, layout: PromptLayout) -> ChunkKV:
    """The exact KV of the system prefix (computed as a prompt of its own)."""
    prefix_only = generator.prefill(PromptLayout((), (), layout.system_ids))
    return prefix_only.kv.segment(0, len(layout.system_ids))


def hf_logits_with_past(
    hf_model: torch.nn.Module, past: PrefillOutput, num_past: int, token_ids: list[int]
) -> torch.Tensor:
    """HF forward of ``token_ids`` after ``num_past`` rows of our KV; last-token logits."""
    cache = DynamicCache()
    for layer_idx in range(past.kv.k.shape[0]):
        keys = past.kv.k[layer_idx, :num_past].transpose(0, 1)[None]
        values = past.kv.v[layer_idx, :num_past].transpose(0, 1)[None]
        cache.update(keys.clone(), values.clone(), layer_idx)
    positions = torch.arange(num_past, num_past + len(token_ids))[None]
    with torch.inference_mode():
        out = hf_model(
            torch.tensor([token_ids]), past_key_values=cache, position_ids=positions, use_cache=True
        )
    return out.logits[0, -1]
