"""A decoder-only transformer assembled from per-layer pieces, loaded from HF weights.

Llama, Mistral, Qwen2 (q/k/v bias) and Qwen3 (per-head q/k RMSNorm) share this layout. The
engine's runner drives the layers one by one through :class:`DecoderLayer.project_qkv` and
:class:`DecoderLayer.finish`, so attention (full, selective or decode) stays in the runner.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from adarag.engine.spec import ModelSpec

# Rows per piece of a layer's output projection and MLP: a 3.7K-token prefill runs as two halves,
# each ~14% faster per row on two EPYC cores than the whole (a half's activations stay in cache).
GEMM_ROWS = 2048


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in float32 as transformers does."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., size]."""
        if x.dtype == torch.float32 == self.weight.dtype:  # one fused kernel, the same values
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        input_dtype = x.dtype
        x32 = x.to(torch.float32)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(input_dtype)


class SelfAttention(nn.Module):
    """Attention projections (q, k and v fused in one matmul); attention runs in the runner."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        q_size = spec.num_heads * spec.head_dim
        kv_size = spec.num_kv_heads * spec.head_dim
        self.qkv_proj = nn.Linear(spec.hidden_size, q_size + 2 * kv_size, bias=spec.qkv_bias)
        self.o_proj = nn.Linear(q_size, spec.hidden_size, bias=False)
        self.split_sizes = (q_size, kv_size, kv_size)
        self.q_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps) if spec.qk_norm else None
        self.k_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps) if spec.qk_norm else None
        self.num_heads = spec.num_heads
        self.num_kv_heads = spec.num_kv_heads
        self.head_dim = spec.head_dim


class GatedMLP(nn.Module):
    """SwiGLU feed-forward, gate and up fused in one matmul: down(silu(gate(x)) * up(x))."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(spec.hidden_size, 2 * spec.intermediate_size, bias=False)
        self.down_proj = nn.Linear(spec.intermediate_size, spec.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [num_tokens, hidden_size]."""
        gate, up = linear(x, self.gate_up_proj).chunk(2, dim=-1)
        return linear(F.silu(gate).mul_(up), self.down_proj)


class DecoderLayer(nn.Module):
    """A pre-norm decoder layer split around its attention."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.self_attn = SelfAttention(spec)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.mlp = GatedMLP(spec)

    def project_qkv(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values before RoPE.

        Args:
            hidden: [num_tokens, hidden_size], the layer's input (residual stream).

        Returns:
            q [num_tokens, num_heads, head_dim], k and v [num_tokens, num_kv_heads, head_dim].
        """
        attn = self.self_attn
        x = self.input_layernorm(hidden)
        num_tokens = x.shape[0]
        q, k, v = linear(x, attn.qkv_proj).split(attn.split_sizes, dim=-1)
        q = q.reshape(num_tokens, attn.num_heads, attn.head_dim)
        k = k.reshape(num_tokens, attn.num_kv_heads, attn.head_dim)
        v = v.reshape(num_tokens, attn.num_kv_heads, attn.head_dim)
        if attn.q_norm is not None and attn.k_norm is not None:
            q, k = attn.q_norm(q), attn.k_norm(k)
        return q, k, v

    def finish(self, hidden: torch.Tensor, attn_output: torch.Tensor) -> torch.Tensor:
        """Output projection, residual, MLP and residual.

        Args:
            hidden: [num_tokens, hidden_size], the layer's input.
            attn_output: [num_tokens, num_heads, head_dim].

        Returns:
            The layer's output [num_tokens, hidden_size].
        """
        attn_output = attn_output.flatten(1)
        num_tokens = hidden.shape[0]
        if num_tokens <= GEMM_ROWS:
            return self._finish_rows(hidden, attn_output)
        pieces = -(-num_tokens // GEMM_ROWS)  # rows are independent here: run them in pieces
        return torch.cat(
            [
                self._finish_rows(rows, attn_rows)
                for rows, attn_rows in zip(
                    hidden.chunk(pieces), attn_output.chunk(pieces), strict=True
                )
            ]
        )

    def _finish_rows(self, hidden: torch.Tensor, attn_output: torch.Tensor) -> torch.Tensor:
        hidden = hidden + linear(attn_output, self.self_attn.o_proj)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class DecoderModel(nn.Module):
    """Embedding, decoder layers, final norm and LM head."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(spec) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        if spec.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """token_ids [num_tokens] -> hidden [num_tokens, hidden_size]."""
        return self.embed_tokens(token_ids)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden [num_tokens, hidden_size] (residual stream) -> float32 [num_tokens, vocab]."""
        return project_to_vocab(self.norm(hidden), self.lm_head.weight).float()

    @property
    def decoder_layers(self) -> Sequence[DecoderLayer]:
        """The layers, bottom first."""
        return self.layers  # type: ignore[return-value]  # a ModuleList of DecoderLayer

    @property
    def final_norm_weight(self) -> torch.Tensor:
        """[hidden_size] weight of the final RMSNorm."""
        return self.norm.weight

    @property
    def lm_head_weight(self) -> torch.Tensor:
        """[vocab, hidden_size] weight of the LM head."""
        return self.lm_head.weight


def pack_for_cpu(model: DecoderModel) -> None:
    """Pre-pack every layer projection's float32 weight in oneDNN's blocked layout.

    torch's ``F.linear`` re-packs the weight on every call; a pre-packed weight saves that (the
    four projections of a SmolLM2 layer over 3.7K rows: 155 -> 133 ms on two EPYC cores, the
    same values there; oneDNN may block a few rows differently, so they can differ from
    ``F.linear`` in the last float32 bits). :func:`linear` uses the packed copy for two or more
    float32 rows on the CPU. It costs a second copy of the layer weights in memory and goes stale
    if the weights are changed in place. Nothing happens on other devices, other dtypes, or a
    torch without oneDNN.
    """
    if not _can_pack(model.lm_head.weight):
        return
    for layer in model.decoder_layers:
        for projection in (
            layer.self_attn.qkv_proj,
            layer.self_attn.o_proj,
            layer.mlp.gate_up_proj,
            layer.mlp.down_proj,
        ):
            packed = torch.ops.mkldnn._reorder_linear_weight(projection.weight, None)
            projection.register_buffer("packed_weight", packed, persistent=False)


def _can_pack(weight: torch.Tensor) -> bool:
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


def linear(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """``layer(x)`` for x [num_tokens, in_features], through the CPU's fastest float32 path.

    One float32 row (a decoding step) multiplies each weight as a two-column GEMM: torch's CPU
    path for one row streams the weights at about 11 GB/s on two EPYC cores, its GEMM with two
    columns at 28 GB/s (SmolLM2's 120 layer projections: 38 vs 15 ms per step; the pre-packed
    oneDNN weight takes 20 ms). More rows use the weight :func:`pack_for_cpu` pre-packed. Other
    dtypes and devices take ``F.linear``.
    """
    if x.device.type != "cpu" or x.dtype != torch.float32 or x.requires_grad:
        return layer(x)  # (the packed weight's op has no backward: a packet's fit takes F.linear)
    if x.shape[0] == 1:
        out = torch.mm(layer.weight, x.repeat(2, 1).T)[:, 0].contiguous()[None]
        return out if layer.bias is None else out + layer.bias
    packed = getattr(layer, "packed_weight", None)
    if packed is None:
        return layer(x)
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, layer.bias, "none", [], "")


def project_to_vocab(normed: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """LM head: normed [num_tokens, hidden_size] -> [num_tokens, vocab] (weight [vocab, hidden]).

    On the CPU torch computes ``x @ Wᵀ`` for a large vocabulary several times slower than
    ``(W @ xᵀ)ᵀ``, and one row (a GEMV) slower than two (SmolLM2's [49152, 576] head on two EPYC
    cores: 9.6 ms for one row as ``x @ Wᵀ``, 3.2 ms for two as ``W @ xᵀ``, 4.4 ms for four), so
    the CPU path takes the second form and pads a single row to two. Other devices use
    ``F.linear``.
    """
    if normed.device.type != "cpu":
        return F.linear(normed, weight)
    num_rows = normed.shape[0]
    columns = (normed if num_rows > 1 else normed.repeat(2, 1)).T
    # row-major again: reductions over the vocabulary (sampling, the lens) are slow on the view
    return torch.mm(weight, columns).T[:num_rows].contiguous()
