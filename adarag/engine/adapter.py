"""The per-layer interface the runner drives; one implementation per weight source.

:class:`adarag.engine.model.DecoderModel` implements it over Hugging Face weights; the vLLM
backend implements it over the vLLM model's own loaded modules, so both share one fusion loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from adarag.engine.spec import ModelSpec


class LayerAdapter(Protocol):
    """One decoder layer split around its attention."""

    def project_qkv(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Hidden [n, hidden_size] -> q [n, heads, dim], k, v [n, kv_heads, dim], before RoPE."""
        ...

    def finish(self, hidden: torch.Tensor, attn_output: torch.Tensor) -> torch.Tensor:
        """Output projection, residual, MLP: hidden [n, hidden_size], attn [n, heads, dim]."""
        ...


class DecoderAdapter(Protocol):
    """A whole decoder-only model as the runner sees it."""

    spec: ModelSpec

    @property
    def decoder_layers(self) -> Sequence[LayerAdapter]:
        """The layers, bottom first."""
        ...

    @property
    def final_norm_weight(self) -> torch.Tensor:
        """[hidden_size] weight of the final RMSNorm."""
        ...

    @property
    def lm_head_weight(self) -> torch.Tensor:
        """[vocab, hidden_size] weight of the LM head."""
        ...

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """token_ids [n] -> hidden [n, hidden_size]."""
        ...

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden [n, hidden_size] -> float32 logits [n, vocab]."""
        ...
