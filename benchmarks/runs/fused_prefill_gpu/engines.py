"""Random weights at Llama-3-8B shapes: our engines and transformers' models over them; prompts."""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch
from common import REPO
from transformers import LlamaConfig, LlamaForCausalLM

from adarag.config import AdaRagConfig
from adarag.engine.checkpoint import Checkpoint
from adarag.engine.core import Engine
from adarag.engine.loader import model_from_state
from adarag.engine.spec import ModelSpec
from adarag.schema import PromptLayout

sys.path.insert(0, str(REPO))
from tests.tiny_models import build_tiny_tokenizer  # noqa: E402

SYSTEM_TOKENS = QUERY_TOKENS = 32


def llama_8b_shapes(num_layers: int) -> LlamaConfig:
    return LlamaConfig(
        hidden_size=4096,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        num_hidden_layers=num_layers,
        vocab_size=128256,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )


def cast_keeping_rope(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """``model.to(dtype)`` with RoPE's inverse frequencies kept in float32.

    ``from_pretrained(dtype=...)`` keeps them so; a plain ``.to(bfloat16)`` rounds them too, and
    then the angles of late positions are radians off (at 8K tokens the logits of such a model
    and of the exact rotation differ by more than their own norm).
    """
    kept = {n: b.clone() for n, b in model.named_buffers() if n.endswith("inv_freq")}
    model = model.to(dtype)
    for name, buffer in kept.items():
        owner, _, attribute = name.rpartition(".")
        model.get_submodule(owner).register_buffer(attribute, buffer, persistent=False)
    return model


def build_engines(
    args: argparse.Namespace, home: Path
) -> tuple[dict[str, Engine], torch.nn.Module, torch.nn.Module]:
    """A Triton and a torch engine sharing one random model; transformers' model of the
    weights in the same dtype, and in float32 (the reference)."""
    config = llama_8b_shapes(args.layers)
    dtype = getattr(torch, args.dtype)
    with torch.device(args.device):
        reference_model = LlamaForCausalLM(config).eval().requires_grad_(False)
    hf_model = cast_keeping_rope(copy.deepcopy(reference_model), dtype)
    path = home / "llama-8b-shapes"
    config.save_pretrained(path)
    tokenizer = build_tiny_tokenizer()
    tokenizer.save_pretrained(path)
    spec = ModelSpec.from_hf_config(config.to_dict())
    model = model_from_state(dict(hf_model.state_dict()), spec, dtype, args.device)
    checkpoint = Checkpoint(path, spec, f"random-{args.layers}-layers", tokenizer)
    engines = {}
    for backend in ("triton", "torch"):
        settings = AdaRagConfig.build(
            home=home,
            engine={"model": str(path), "device": args.device, "dtype": args.dtype},
            kernels={"backend": backend},
        )
        engines[backend] = Engine.for_model(checkpoint, model, settings.engine, settings.kernels)
    return engines, hf_model, reference_model


def random_layout(num_tokens: int, chunk_tokens: int, rng: torch.Generator) -> PromptLayout:
    """System prefix, chunks and query suffix of random ids, ``num_tokens`` in all."""

    def ids(count: int) -> tuple[int, ...]:
        return tuple(torch.randint(1000, 128000, (count,), generator=rng).tolist())

    num_chunks = max(1, (num_tokens - SYSTEM_TOKENS - QUERY_TOKENS) // chunk_tokens)
    return PromptLayout(
        system_ids=ids(SYSTEM_TOKENS),
        chunk_ids=tuple(ids(chunk_tokens) for _ in range(num_chunks)),
        query_ids=ids(QUERY_TOKENS),
    )
