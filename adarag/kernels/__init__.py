"""Public kernel dispatchers: Triton on CUDA, torch twins (or vLLM-CPU's attention) on the CPU."""

from __future__ import annotations

from adarag.kernels._dispatch import Backend
from adarag.kernels.kv_scatter import kv_scatter
from adarag.kernels.logit_lens import lens_signals_from_logits, logit_lens
from adarag.kernels.rope_delta import rope_delta
from adarag.kernels.selective_attention import (
    prepare_selective_attention,
    segment_attention_mass,
    selective_attention,
)

__all__ = [
    "Backend",
    "kv_scatter",
    "lens_signals_from_logits",
    "logit_lens",
    "prepare_selective_attention",
    "rope_delta",
    "segment_attention_mass",
    "selective_attention",
]
