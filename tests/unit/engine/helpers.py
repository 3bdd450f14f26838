"""Builders shared by the engine tests."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from adarag.config import AdaRagConfig, PromptConfig
from adarag.engine.batch import PrefillOutput, SegmentSource
from adarag.engine.core import Engine
from adarag.evaluation.reuse import independent_chunks, reuse_sources
from adarag.kv import ChunkKV
from adarag.pipeline import backends
from adarag.pipeline.answer_stream import decode_text
from adarag.pipeline.prompt import PromptBuilder
from adarag.schema import GenerationParams, PromptLayout

CHUNKS = (
    "paris is the capital of france and the seine runs through it.",
    "berlin is the capital of germany; the spree runs through berlin.",
    "the quick brown fox jumps over the lazy dog near the river.",
)
QUESTION = "what is the capital of france?"


def load_engine(config: AdaRagConfig) -> Engine:
    """The engine of ``config`` (as the pipeline loads it)."""
    return backends.load_engine(config.engine, config.kernels, config.home)


def layout_of(
    engine: Engine, question: str, chunks, prompt: PromptConfig | None = None
) -> PromptLayout:
    """The pipeline's prompt layout of ``question`` over ``chunks``."""
    return PromptBuilder(engine.tokenizer, prompt or PromptConfig()).layout(question, chunks)


def answer_text(
    engine: Engine, layout: PromptLayout, output: PrefillOutput, params: GenerationParams
) -> str:
    """The decoded answer of a prefill."""
    tokens = engine.decode_tokens(layout, output, params)
    return "".join(decode_text(tokens, engine.tokenizer, params))


def independent_sources(
    engine: Engine, layout: PromptLayout, ratio: float
) -> tuple[list[SegmentSource], list[ChunkKV], ChunkKV]:
    """Sources that reuse the exact system KV and each chunk's independent KV at ``ratio``."""
    system_kv, chunk_kvs = independent_chunks(engine, layout)
    return reuse_sources(system_kv, chunk_kvs, ratio), chunk_kvs, system_kv


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
