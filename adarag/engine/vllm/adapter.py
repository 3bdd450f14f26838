"""The runner's view (:class:`DecoderAdapter`) of a model vLLM loaded: its own modules, no copy.

Llama, Mistral, Qwen2 and Qwen3 share one layout in vLLM: ``model.embed_tokens``, decoder layers
with ``input_layernorm``, ``self_attn.qkv_proj`` (q, k, v fused; Qwen2 with bias, Qwen3 with
per-head ``q_norm``/``k_norm``), ``self_attn.o_proj``, ``post_attention_layernorm`` and ``mlp``
(fused gate/up, SiLU, down), then ``model.norm``, ``lm_head`` and ``logits_processor``. The
adapter calls those modules as vLLM's forward does, but leaves attention to adarag's runner.
vLLM's CPU backend repacks linear weights for oneDNN, so linears are called, never read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch
from torch import nn

from adarag.engine.spec import ModelSpec
from adarag.errors import ModelLoadError

SUPPORTED_ARCHITECTURES: dict[str, tuple[str, ...]] = {
    "llama": ("LlamaForCausalLM",),
    "mistral": ("MistralForCausalLM", "LlamaForCausalLM"),
    "qwen2": ("Qwen2ForCausalLM",),
    "qwen3": ("Qwen3ForCausalLM",),
}
"""adarag model family -> vLLM model classes whose modules the adapter knows."""


class VLLMLayer:
    """One vLLM decoder layer split around its attention."""

    def __init__(self, layer: nn.Module, spec: ModelSpec) -> None:
        self.layer: Any = layer  # vLLM's decoder layer class of the family
        self.attn: Any = layer.self_attn
        self.num_heads = spec.num_heads
        self.num_kv_heads = spec.num_kv_heads
        self.head_dim = spec.head_dim
        q_size = spec.num_heads * spec.head_dim
        kv_size = spec.num_kv_heads * spec.head_dim
        self.split_sizes = (q_size, kv_size, kv_size)
        self.has_qk_norm = spec.qk_norm

    def project_qkv(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values before RoPE.

        Args:
            hidden: [num_tokens, hidden_size], the layer's input (residual stream).

        Returns:
            q [num_tokens, num_heads, head_dim], k and v [num_tokens, num_kv_heads, head_dim].
        """
        x = self.layer.input_layernorm(hidden)
        qkv, _ = self.attn.qkv_proj(x)
        q, k, v = qkv.split(self.split_sizes, dim=-1)
        num_tokens = x.shape[0]
        q = q.reshape(num_tokens, self.num_heads, self.head_dim)
        k = k.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        if self.has_qk_norm:
            q, k = self.attn.q_norm(q), self.attn.k_norm(k)
        return q, k, v

    def finish(self, hidden: torch.Tensor, attn_output: torch.Tensor) -> torch.Tensor:
        """Output projection, residual, MLP and residual.

        Args:
            hidden: [num_tokens, hidden_size], the layer's input.
            attn_output: [num_tokens, num_heads, head_dim].

        Returns:
            The layer's output [num_tokens, hidden_size].
        """
        projected, _ = self.attn.o_proj(attn_output.flatten(1))
        hidden = hidden + projected
        return hidden + self.layer.mlp(self.layer.post_attention_layernorm(hidden))


class VLLMDecoderAdapter:
    """A vLLM causal LM seen as a :class:`adarag.engine.adapter.DecoderAdapter`.

    Args:
        model: The ``nn.Module`` vLLM's worker loaded (e.g. ``LlamaForCausalLM``).
        spec: The architecture facts read from the same checkpoint.

    Raises:
        ModelLoadError: vLLM loaded a model class the adapter does not know.
    """

    def __init__(self, model: nn.Module, spec: ModelSpec) -> None:
        check_supported(type(model).__name__, spec.family)
        self.vllm_model: Any = model  # vLLM's causal-LM class of the family
        self.spec = spec
        self._layers = [VLLMLayer(layer, spec) for layer in cast(Any, model).model.layers]
        assert len(self._layers) == spec.num_layers, (
            f"vLLM model has {len(self._layers)} layers, the checkpoint {spec.num_layers}"
        )

    @property
    def decoder_layers(self) -> Sequence[VLLMLayer]:
        """The layers, bottom first."""
        return self._layers

    @property
    def final_norm_weight(self) -> torch.Tensor:
        """[hidden_size] weight of the final RMSNorm."""
        return self.vllm_model.model.norm.weight

    @property
    def lm_head_weight(self) -> torch.Tensor:
        """[vocab, hidden_size] weight of the LM head (the embedding when tied)."""
        weight = self.vllm_model.lm_head.weight
        assert weight.dim() == 2 and weight.shape[0] >= self.spec.vocab_size, (
            f"vLLM's lm_head weight has shape {tuple(weight.shape)}"
        )
        return weight[: self.spec.vocab_size]

    @property
    def device(self) -> torch.device:
        """Where vLLM placed the weights."""
        return self.vllm_model.model.norm.weight.device

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """token_ids [num_tokens] -> hidden [num_tokens, hidden_size]."""
        return self.vllm_model.model.embed_tokens(token_ids)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden [num_tokens, hidden_size] (residual stream) -> float32 [num_tokens, vocab]."""
        model = self.vllm_model
        logits = model.logits_processor(model.lm_head, model.model.norm(hidden))
        return logits[:, : self.spec.vocab_size].float()


def check_supported(architecture: str, family: str) -> None:
    """Raise unless vLLM's model class ``architecture`` is one the adapter knows for ``family``.

    Raises:
        ModelLoadError: Naming the supported families and vLLM classes.
    """
    if architecture in SUPPORTED_ARCHITECTURES.get(family, ()):
        return
    supported = "; ".join(
        f"{name} ({', '.join(classes)})" for name, classes in SUPPORTED_ARCHITECTURES.items()
    )
    raise ModelLoadError(
        f"vLLM loaded {architecture} for model family {family!r}, which adarag's vLLM adapter "
        f"does not support; supported families (vLLM classes): {supported}"
    )
