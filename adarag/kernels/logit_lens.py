"""Logit-lens uncertainty signals of the last token over the last l layers.

For hidden states ``h_1..h_l`` (the last token after each of the last l layers), with the final
RMSNorm ``n`` and the LM head ``W``::

    log p_i = log_softmax(W n(h_i))
    kl_i    = KL(p_l || p_i) = sum_v p_l(v) (log p_l(v) - log p_i(v)),   i = 1..l-1
    entropy = -sum_v p_l(v) log p_l(v)

Inputs: ``hidden [l, hidden_size]``, ``norm_weight [hidden_size]``, ``lm_head_weight
[vocab, hidden_size]``. Outputs: ``kl [l - 1]`` and ``entropy []``, float32, in nats. Source:
AdaCache section 3.2 (confidence from the last l layers); logit lens (nostalgebraist, 2020).

The Triton kernel reads the LM head once, in its own dtype, and never materialises the
``[l, vocab]`` logits: the twin's ``lm_head_weight.to(float32)`` copies the whole head (2 GB for
Llama-3-8B's bfloat16 ``[128256, 4096]``) on every confidence check. One program computes the
float32 logits ``z`` of a block of the vocabulary for all l rows and reduces them to partial sums
under the block's maxima ``m``: ``sum exp(z_i - m_i)``, ``sum exp(z_l - m_l) (z_l - z_i)`` and
``sum exp(z_l - m_l) z_l``. The host combines the blocks as in a split softmax, using
``kl_i = E_{p_l}[z_l - z_i] - lse_l + lse_i`` and ``entropy = lse_l - E_{p_l}[z_l]``.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

import torch

from adarag.kernels._dispatch import Backend, jit_kernels, use_triton

if TYPE_CHECKING:
    import triton.language as tl


def logit_lens_ref(
    hidden: torch.Tensor, norm_weight: torch.Tensor, eps: float, lm_head_weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure-torch twin (see module docstring); computed in float32."""
    x = hidden.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.to(torch.float32)
    # W @ xᵀ rather than x @ Wᵀ: the same product, several times faster on CPUs for a big vocab
    return lens_signals_from_logits((lm_head_weight.to(torch.float32) @ x.T).T)


def lens_signals_from_logits(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Logit-lens signals from logits already computed: [l, vocab] -> kl [l - 1], entropy [].

    Float32, in nats, as :func:`logit_lens_ref` returns them. A prefill that projects the last
    l layers' hidden states through the LM head in one GEMM (its last row is the decoding
    logits, needed anyway) leaves only this reduction to the confidence check.
    """
    # kl_i = E_{p_l}[z_l - z_i] - lse_l + lse_i and entropy = lse_l - E_{p_l}[z_l], as in the
    # kernel. Exponents are clamped at -75 so that no term (nor p_l = term / sum, sum <= vocab)
    # is a float32 denormal, whose arithmetic is an order of magnitude slower on x86 CPUs; the
    # terms changed are below e^-75 of the largest.
    z = logits.to(torch.float32)
    top = z.amax(dim=-1, keepdim=True)
    terms = torch.exp((z - top).clamp_(min=-75.0))  # [l, vocab]
    sums = terms.sum(dim=-1)
    lse = top.squeeze(-1) + torch.log(sums)
    final_probs = terms[-1] / sums[-1]
    expected = z @ final_probs  # [l]: E_{p_l}[z_i]
    kl = expected[-1] - expected[:-1] - lse[-1] + lse[:-1]
    entropy = lse[-1] - expected[-1]
    return kl, entropy


def _logit_lens_kernel(  # type: ignore[no-untyped-def]
    x_ptr,
    weight_ptr,
    block_max_ptr,
    block_sum_ptr,
    block_gap_ptr,
    block_final_ptr,
    num_rows,
    vocab_size,
    hidden_size,
    stride_x_row,
    stride_weight_vocab,
    ROWS_PADDED: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Partial softmax sums of one vocabulary block for all rows; grid (vocab blocks,)."""
    vocab_block = tl.program_id(0)
    rows = tl.arange(0, ROWS_PADDED)
    vocab = vocab_block * BLOCK_V + tl.arange(0, BLOCK_V)
    is_row = rows < num_rows
    is_vocab = vocab < vocab_size
    # logits z = x @ W^T in float32: [ROWS_PADDED, BLOCK_V]
    logits = tl.zeros([ROWS_PADDED, BLOCK_V], dtype=tl.float32)
    for k_start in range(0, hidden_size, BLOCK_K):
        cols = k_start + tl.arange(0, BLOCK_K)
        is_col = cols < hidden_size
        x_mask = is_row[:, None] & is_col[None, :]
        x = tl.load(x_ptr + rows[:, None] * stride_x_row + cols[None, :], mask=x_mask, other=0.0)
        w_mask = is_col[:, None] & is_vocab[None, :]
        w_tile = tl.load(
            weight_ptr + vocab[None, :] * stride_weight_vocab + cols[:, None],
            mask=w_mask,
            other=0.0,
        )
        logits += tl.dot(x, w_tile.to(tl.float32), input_precision="ieee")
    # block maxima and sums of exponentials per row (words past the vocabulary excluded)
    masked = tl.where(is_vocab[None, :], logits, float("-inf"))
    block_max = tl.max(masked, 1)
    block_sum = tl.sum(tl.exp(masked - block_max[:, None]), 1)
    # final-layer weights exp(z_l - m_l) and the gaps z_l - z_i: [BLOCK_V], [ROWS_PADDED, BLOCK_V]
    is_final = rows == num_rows - 1
    final = tl.sum(tl.where(is_final[:, None], logits, 0.0), 0)
    final_max = tl.max(tl.where(is_vocab, final, float("-inf")), 0)
    final_weight = tl.where(is_vocab, tl.exp(final - final_max), 0.0)
    block_gap = tl.sum(final_weight[None, :] * (final[None, :] - logits), 1)
    block_final = tl.sum(final_weight * final, 0)
    # store the partials of this block
    out_offsets = vocab_block * ROWS_PADDED + rows
    tl.store(block_max_ptr + out_offsets, block_max, mask=is_row)
    tl.store(block_sum_ptr + out_offsets, block_sum, mask=is_row)
    tl.store(block_gap_ptr + out_offsets, block_gap, mask=is_row)
    tl.store(block_final_ptr + vocab_block, block_final)


@functools.cache
def _compiled_kernel() -> Any:
    (kernel,) = jit_kernels(_logit_lens_kernel)
    return kernel


def logit_lens_triton(
    hidden: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    lm_head_weight: torch.Tensor,
    *,
    block_v: int = 128,
    block_k: int = 32,
    num_warps: int = 8,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton implementation of :func:`logit_lens_ref` (same arguments and results).

    Args:
        hidden: [l, hidden_size], l >= 1.
        norm_weight: [hidden_size].
        eps: RMSNorm epsilon.
        lm_head_weight: [vocab, hidden_size], last dim contiguous, any float dtype.
        block_v: Vocabulary entries per program; a power of two, at least 16.
        block_k: Hidden features per step; a power of two, at least 16.
        num_warps: Warps per program. The defaults compile for sm_90 without register spills.
    """
    num_rows, hidden_size = hidden.shape
    vocab_size = lm_head_weight.shape[0]
    assert num_rows >= 1, "logit lens needs at least one layer"
    assert norm_weight.shape == (hidden_size,), f"norm_weight must be [{hidden_size}]"
    assert lm_head_weight.shape == (vocab_size, hidden_size), (
        f"lm_head_weight must be [vocab, {hidden_size}], got {tuple(lm_head_weight.shape)}"
    )
    assert lm_head_weight.stride(-1) == 1, "lm_head_weight's last dimension must be contiguous"
    assert hidden.device == lm_head_weight.device == norm_weight.device, "devices differ"
    for name, block in (("block_v", block_v), ("block_k", block_k)):
        assert block >= 16 and block & (block - 1) == 0, f"{name} must be a power of two >= 16"
    # --- normalise: l rows of RMSNorm in float32, as the twin does (no autograd: the kernel
    # has no backward)
    x = hidden.detach().to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    x = (x * norm_weight.detach().to(torch.float32)).contiguous()
    # --- partial sums per vocabulary block
    rows_padded = max(16, 1 << (num_rows - 1).bit_length())
    num_blocks = math.ceil(vocab_size / block_v)
    partials = torch.empty(3, num_blocks, rows_padded, dtype=torch.float32, device=x.device)
    block_final = torch.empty(num_blocks, dtype=torch.float32, device=x.device)
    _compiled_kernel()[(num_blocks,)](
        x,
        lm_head_weight,
        partials[0],
        partials[1],
        partials[2],
        block_final,
        num_rows,
        vocab_size,
        hidden_size,
        x.stride(0),
        lm_head_weight.stride(0),
        ROWS_PADDED=rows_padded,
        BLOCK_V=block_v,
        BLOCK_K=block_k,
        num_warps=num_warps,
    )
    # --- combine the blocks: log-sum-exp per row, expectations under the final distribution
    block_max, block_sum, block_gap = partials[:, :, :num_rows]
    row_max = block_max.max(dim=0).values
    rescale = torch.exp(block_max - row_max)  # [num_blocks, l]
    row_sum = (block_sum * rescale).sum(dim=0)
    lse = row_max + torch.log(row_sum)
    final_rescale = rescale[:, -1] / row_sum[-1]  # block weights of p_l
    expected_gap = (block_gap * final_rescale[:, None]).sum(dim=0)
    expected_final = (block_final * final_rescale).sum()
    kl = expected_gap[:-1] - lse[-1] + lse[:-1]
    entropy = lse[-1] - expected_final
    return kl, entropy


def logit_lens(
    hidden: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    lm_head_weight: torch.Tensor,
    *,
    backend: Backend = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """KL of each earlier lens layer to the final one, and the final entropy.

    Args:
        hidden: [l, hidden_size] last-token residual stream after each of the last l layers.
        norm_weight: [hidden_size] final RMSNorm weight.
        eps: RMSNorm epsilon.
        lm_head_weight: [vocab, hidden_size].
        backend: Kernel backend ("auto", "triton" or "torch").

    Returns:
        ``(kl [l - 1], entropy [])`` in float32 nats.
    """
    if use_triton(backend, hidden, norm_weight, lm_head_weight):
        return logit_lens_triton(hidden, norm_weight, eps, lm_head_weight)
    return logit_lens_ref(hidden, norm_weight, eps, lm_head_weight)
