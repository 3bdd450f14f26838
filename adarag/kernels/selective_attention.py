"""Attention of selected queries over a fused KV cache, with an absolute-position causal mask.

For query ``i`` at absolute position ``p_i`` and key ``j`` at absolute position ``j``::

    a_ij  = softmax_{j <= p_i}(scale * q_i . k_j)
    out_i = sum_j a_ij v_j                                   (selective_attention)
    mass_is = sum_{j in segment s} a_ij                      (segment_attention_mass)

Grouped-query attention: query head ``h`` reads KV head ``h // (num_heads // num_kv_heads)``.
``segment_attention_mass`` gives, per query and head, the attention probability mass that falls in
each key segment ``[cu_segments[s], cu_segments[s + 1])`` -- what first-layer cross-chunk token
selection and the attention-sink profiler need, and what FlashAttention cannot give. The torch
twin computes it as attention over one-hot segment-indicator values, so it runs on the same fused
attention kernel as the output.

Inputs: ``q [num_q, num_heads, head_dim]``; ``k, v [num_kv, num_kv_heads, head_dim]`` (row ``j``
holds position ``j``); ``q_positions [num_q]`` int64, ascending and unique; ``cu_segments
[num_segments + 1]`` int64. Outputs: ``out [num_q, num_heads, head_dim]`` in q's dtype; ``mass
[num_q, num_heads, num_segments]`` float32. The mask is by absolute position, never bottom-right
aligned: a selected token never attends to a later position (CacheBlend's public code aligns its
selected queries bottom-right, so a recomputed token there can attend to positions after it).

The Triton kernel is one FlashAttention-2 style forward (online softmax in base 2, float32
accumulators) for both ops. A program owns ``BLOCK_M`` rows of one KV head, a row being a
(query, query head of the KV head's group) pair, so every K/V tile it loads serves the whole GQA
group. It walks key blocks from 0: blocks before the block's first query position need no mask,
the rest up to its last position are masked by ``j <= p_i``, and later keys are never read. The
constexpr ``WRITE_MASS`` swaps the value tile for the one-hot segment membership of the keys, so
the same loop accumulates ``sum_j a_ij [j in segment s]`` and writes float32 segment masses (the
products run on float16 tensor cores for 16-bit inputs, in IEEE float32 for float32 inputs).
Source: AdaCache section 3.1; CacheBlend section 4; FlashAttention-2 (Dao, 2023) algorithm 1 and
Triton's fused-attention tutorial.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.nn.functional as F  # noqa: N812

from adarag.kernels import vllm_cpu_attention
from adarag.kernels._dispatch import (
    Backend,
    is_triton_interpreted,
    jit_kernels,
    use_triton,
    use_vllm_cpu,
)

if TYPE_CHECKING:
    import triton.language as tl


def selective_attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_positions: torch.Tensor,
    scale: float,
    query_block: int = 128,
    key_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Pure-torch twin of :func:`selective_attention` (the only path with ``key_bias``)."""
    return _blocked_attention(q, k, v, q_positions, scale, query_block, key_bias)


def segment_attention_mass_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    q_positions: torch.Tensor,
    scale: float,
    cu_segments: torch.Tensor,
    query_block: int = 128,
) -> torch.Tensor:
    """Pure-torch twin of :func:`segment_attention_mass`."""
    num_q, num_heads, head_dim = q.shape
    num_kv, num_kv_heads, _ = k.shape
    num_segments = cu_segments.numel() - 1
    # One-hot segment membership of every key, padded to head_dim columns per pass so that the
    # values have the keys' width (the fused CPU kernel needs it).
    owner = torch.bucketize(torch.arange(num_kv), cu_segments[1:].cpu(), right=True)
    num_passes = -(-num_segments // head_dim)
    indicator = torch.zeros(num_kv, num_passes * head_dim, dtype=q.dtype, device=q.device)
    indicator[torch.arange(num_kv), owner.to(q.device)] = 1.0
    mass = torch.empty(
        num_q, num_heads, num_passes * head_dim, dtype=torch.float32, device=q.device
    )
    for pass_idx in range(num_passes):
        columns = indicator[:, pass_idx * head_dim : (pass_idx + 1) * head_dim]
        values = columns[:, None, :].expand(num_kv, num_kv_heads, head_dim)
        block_mass = _blocked_attention(q, k, values, q_positions, scale, query_block)
        mass[..., pass_idx * head_dim : (pass_idx + 1) * head_dim] = block_mass.float()
    return mass[..., :num_segments]


def _attention_block(  # type: ignore[no-untyped-def]
    acc,
    row_sum,
    row_max,
    q,
    k_head_ptr,
    v_head_ptr,
    positions,
    segment_starts,
    segment_ends,
    key_start,
    num_kv,
    scale_log2,
    stride_k_token,
    stride_v_token,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PADDED: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_MASKED: tl.constexpr,
    WRITE_MASS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """One key block of the online softmax: update ``acc``, ``row_sum`` and ``row_max``."""
    keys = key_start + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM_PADDED)
    # keys of unmasked blocks all exist (their blocks end at or before num_kv)
    is_key = (keys < num_kv) | (not IS_MASKED)
    # load K^T: [HEAD_DIM_PADDED, BLOCK_N]
    k_mask = is_key[None, :] & (dims < HEAD_DIM)[:, None]
    k_tile = tl.load(
        k_head_ptr + keys[None, :] * stride_k_token + dims[:, None], mask=k_mask, other=0.0
    ).to(q.dtype)
    # scores in log2 units: [BLOCK_M, BLOCK_N]
    scores = tl.dot(q, k_tile, input_precision=DOT_PRECISION) * scale_log2
    # mask: row i sees key j only when j <= p_i (absolute positions)
    if IS_MASKED:
        visible = (keys[None, :] <= positions[:, None]) & is_key[None, :]
        scores = tl.where(visible, scores, float("-inf"))
    # online softmax: rescale what was accumulated under the old row maximum
    new_max = tl.maximum(row_max, tl.max(scores, 1))
    probs = tl.math.exp2(scores - new_max[:, None])
    alpha = tl.math.exp2(row_max - new_max)
    row_sum = row_sum * alpha + tl.sum(probs, 1)
    # accumulate probs @ values; in WRITE_MASS mode the values are one-hot segment indicators,
    # multiplied on float16 tensor cores (probs in [0, 1] keep 11 bits) unless dots run in float32
    if WRITE_MASS:
        in_segment = (keys[:, None] >= segment_starts[None, :]) & (
            keys[:, None] < segment_ends[None, :]
        )
        acc = acc * alpha[:, None]
        if q.dtype == tl.float32:
            acc += tl.dot(probs, in_segment.to(tl.float32), input_precision=DOT_PRECISION)
        else:
            acc += tl.dot(probs.to(tl.float16), in_segment.to(tl.float16))
    else:
        v_mask = is_key[:, None] & (dims < HEAD_DIM)[None, :]
        v_tile = tl.load(
            v_head_ptr + keys[:, None] * stride_v_token + dims[None, :], mask=v_mask, other=0.0
        ).to(q.dtype)
        acc = acc * alpha[:, None]
        acc += tl.dot(probs.to(v_tile.dtype), v_tile, input_precision=DOT_PRECISION)
    return acc, row_sum, new_max


def _selective_attention_kernel(  # type: ignore[no-untyped-def]
    q_ptr,
    k_ptr,
    v_ptr,
    positions_ptr,
    cu_segments_ptr,
    out_ptr,
    num_q,
    num_kv,
    num_segments,
    scale_log2,
    stride_q_token,
    stride_q_head,
    stride_k_token,
    stride_k_head,
    stride_v_token,
    stride_v_head,
    stride_out_token,
    stride_out_head,
    GROUP_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PADDED: tl.constexpr,
    OUT_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    WRITE_MASS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
):
    """Attention (or segment mass) of BLOCK_M (query, head) rows; grid (row blocks, kv heads)."""
    kv_head = tl.program_id(1)
    # the last row blocks see the most keys: launch them first to shorten the tail
    row_block = tl.num_programs(0) - 1 - tl.program_id(0)
    rows = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
    token_idx = rows // GROUP_SIZE
    head_idx = kv_head * GROUP_SIZE + rows % GROUP_SIZE
    is_row = token_idx < num_q
    dims = tl.arange(0, HEAD_DIM_PADDED)
    # load positions (padding rows stand at 0) and the queries: [BLOCK_M, HEAD_DIM_PADDED]
    positions = tl.load(positions_ptr + token_idx, mask=is_row, other=0).to(tl.int32)
    q_rows = q_ptr + token_idx * stride_q_token + head_idx * stride_q_head
    q_mask = is_row[:, None] & (dims < HEAD_DIM)[None, :]
    q = tl.load(q_rows[:, None] + dims[None, :], mask=q_mask, other=0.0)
    # the K/V tiles follow q's dtype: the input dtype, or float32 where dots must run in it
    if DOT_IN_FP32:
        q = q.to(tl.float32)
    # segment bounds of the one-hot values (empty segments past num_segments): [OUT_DIM]
    segments = tl.arange(0, OUT_DIM)
    if WRITE_MASS:
        is_segment = segments < num_segments
        segment_starts = tl.load(cu_segments_ptr + segments, mask=is_segment, other=0)
        segment_ends = tl.load(cu_segments_ptr + segments + 1, mask=is_segment, other=0)
        num_columns = num_segments
    else:
        segment_starts = tl.zeros([OUT_DIM], dtype=tl.int64)
        segment_ends = segment_starts
        num_columns = HEAD_DIM
    # key range: [0, unmasked_end) is visible to every row, [unmasked_end, kv_end) needs the mask
    first_position = tl.min(tl.where(is_row, positions, num_kv - 1), 0)
    last_position = tl.max(positions, 0)
    unmasked_end = (tl.minimum(first_position + 1, num_kv) // BLOCK_N) * BLOCK_N
    kv_end = tl.minimum(last_position + 1, num_kv)
    # accumulators in float32
    acc = tl.zeros([BLOCK_M, OUT_DIM], dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    k_head_ptr = k_ptr + kv_head * stride_k_head
    v_head_ptr = v_ptr + kv_head * stride_v_head
    for key_start in range(0, unmasked_end, BLOCK_N):
        acc, row_sum, row_max = _attention_block(
            acc,
            row_sum,
            row_max,
            q,
            k_head_ptr,
            v_head_ptr,
            positions,
            segment_starts,
            segment_ends,
            key_start,
            num_kv,
            scale_log2,
            stride_k_token,
            stride_v_token,
            HEAD_DIM,
            HEAD_DIM_PADDED,
            BLOCK_N,
            False,
            WRITE_MASS,
            DOT_PRECISION,
        )
    for key_start in range(unmasked_end, kv_end, BLOCK_N):
        acc, row_sum, row_max = _attention_block(
            acc,
            row_sum,
            row_max,
            q,
            k_head_ptr,
            v_head_ptr,
            positions,
            segment_starts,
            segment_ends,
            key_start,
            num_kv,
            scale_log2,
            stride_k_token,
            stride_v_token,
            HEAD_DIM,
            HEAD_DIM_PADDED,
            BLOCK_N,
            True,
            WRITE_MASS,
            DOT_PRECISION,
        )
    # normalise and store: outputs in the output dtype, masses in float32
    acc = acc / row_sum[:, None]
    out_rows = out_ptr + token_idx * stride_out_token + head_idx * stride_out_head
    out_columns = tl.arange(0, OUT_DIM)
    out_mask = is_row[:, None] & (out_columns < num_columns)[None, :]
    out_values = acc.to(out_ptr.dtype.element_ty)
    tl.store(out_rows[:, None] + out_columns[None, :], out_values, mask=out_mask)


@functools.cache
def _compiled_kernel() -> Any:
    _, kernel = jit_kernels(_attention_block, _selective_attention_kernel)
    return kernel


class AttentionTiling(NamedTuple):
    """Launch settings of the attention kernel."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def _default_tiling(dtype: torch.dtype, head_dim_padded: int, write_mass: bool) -> AttentionTiling:
    """Fixed launch settings, not autotuned (the first call compiles once per shape class).

    Chosen so that the kernel compiles for sm_90 without register spills up to head_dim 128
    (checked with ptxas): 16-bit inputs use 128-row tiles on 8 warps with 64 keys per step (64
    rows on 4 warps for head_dim 128, the fastest spill-free tiling of the H200 sweep in
    ``benchmarks/results/kernels-gpu/kernels_gpu.md``; larger heads take 64 x 16); float32 dots
    run in IEEE float32 without tensor cores, in 32 x 32 tiles; the mass pass of 16-bit inputs
    holds no value tile and takes 128 x 64. Triton's interpreter has no registers to spill and pays
    per program step, so it takes the largest tiles.
    """
    if is_triton_interpreted():
        return AttentionTiling(block_m=128, block_n=64, num_warps=4, num_stages=1)
    if dtype == torch.float32:
        return AttentionTiling(block_m=32, block_n=32, num_warps=4, num_stages=2)
    if write_mass:
        return AttentionTiling(block_m=128, block_n=64, num_warps=8, num_stages=2)
    if head_dim_padded <= 64:
        return AttentionTiling(block_m=128, block_n=64, num_warps=8, num_stages=3)
    if head_dim_padded <= 128:
        return AttentionTiling(block_m=64, block_n=64, num_warps=4, num_stages=3)
    return AttentionTiling(block_m=64, block_n=16, num_warps=4, num_stages=2)


def _launch_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_positions: torch.Tensor,
    scale: float,
    cu_segments: torch.Tensor | None,
    tiling: AttentionTiling | None,
) -> torch.Tensor:
    """Check the inputs and run the kernel; output or mass (``cu_segments`` given)."""
    assert q.dim() == 3 and k.dim() == 3, f"q {tuple(q.shape)} and k {tuple(k.shape)} must be 3-D"
    num_q, num_heads, head_dim = q.shape
    num_kv, num_kv_heads, _ = k.shape
    assert k.shape[2] == head_dim, f"q head_dim {head_dim} != k head_dim {k.shape[2]}"
    assert v.shape == k.shape, f"v {tuple(v.shape)} must match k {tuple(k.shape)}"
    assert num_heads % num_kv_heads == 0, f"{num_heads} heads over {num_kv_heads} KV heads"
    assert q.dtype == k.dtype == v.dtype, f"dtypes differ: q {q.dtype}, k {k.dtype}, v {v.dtype}"
    assert q.dtype in (torch.float32, torch.float16, torch.bfloat16), f"dtype {q.dtype}"
    assert q_positions.shape == (num_q,), f"q_positions must be [{num_q}]"
    assert not q_positions.is_floating_point(), "q_positions must be an integer tensor"
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        assert tensor.stride(-1) == 1, f"{name}'s last dimension must be contiguous"
        assert tensor.device == q_positions.device, f"{name} is on {tensor.device}"
    assert num_kv > 0, "attention over an empty KV cache"
    write_mass = cu_segments is not None
    head_dim_padded = max(16, 1 << (head_dim - 1).bit_length())
    if cu_segments is None:
        num_segments, out_dim = 0, head_dim_padded
        cu_segments = q_positions  # never read
        out = torch.empty(num_q, num_heads, head_dim, dtype=q.dtype, device=q.device)
    else:
        assert cu_segments.dim() == 1 and cu_segments.numel() >= 2, "cu_segments needs 2+ bounds"
        num_segments = cu_segments.numel() - 1
        out_dim = max(16, 1 << (num_segments - 1).bit_length())
        cu_segments = cu_segments.to(device=q.device, dtype=torch.int64).contiguous()
        out = torch.empty(num_q, num_heads, num_segments, dtype=torch.float32, device=q.device)
    if num_q == 0:
        return out
    tiling = tiling or _default_tiling(q.dtype, head_dim_padded, write_mass)
    group_size = num_heads // num_kv_heads
    # Triton's interpreter multiplies the raw bits of bfloat16 dot operands (triton-lang/triton
    # #11584), so interpreted bfloat16 runs its dots on exact float32 upcasts.
    dot_in_fp32 = q.dtype == torch.float32 or (
        q.dtype == torch.bfloat16 and is_triton_interpreted()
    )
    grid = (math.ceil(num_q * group_size / tiling.block_m), num_kv_heads)
    _compiled_kernel()[grid](
        q,
        k,
        v,
        q_positions.contiguous(),
        cu_segments,
        out,
        num_q,
        num_kv,
        num_segments,
        scale * math.log2(math.e),
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        out.stride(0),
        out.stride(1),
        GROUP_SIZE=group_size,
        HEAD_DIM=head_dim,
        HEAD_DIM_PADDED=head_dim_padded,
        OUT_DIM=out_dim,
        BLOCK_M=tiling.block_m,
        BLOCK_N=tiling.block_n,
        WRITE_MASS=write_mass,
        DOT_PRECISION="ieee" if dot_in_fp32 else "tf32",
        DOT_IN_FP32=dot_in_fp32,
        num_warps=tiling.num_warps,
        num_stages=tiling.num_stages,
    )
    return out


def selective_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_positions: torch.Tensor,
    scale: float,
    *,
    tiling: AttentionTiling | None = None,
) -> torch.Tensor:
    """Triton implementation of :func:`selective_attention_ref`.

    Args:
        q: [num_q, num_heads, head_dim], last dim contiguous.
        k: [num_kv, num_kv_heads, head_dim], last dim contiguous; row j is position j.
        v: [num_kv, num_kv_heads, head_dim], last dim contiguous.
        q_positions: [num_q] int64 positions, each < num_kv (any order).
        scale: Softmax scale.
        tiling: Launch settings; default :func:`_default_tiling`.

    Returns:
        out [num_q, num_heads, head_dim] in q's dtype, on q's device.
    """
    return _launch_attention(q, k, v, q_positions, scale, None, tiling)


def segment_attention_mass_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    q_positions: torch.Tensor,
    scale: float,
    cu_segments: torch.Tensor,
    *,
    tiling: AttentionTiling | None = None,
) -> torch.Tensor:
    """Triton implementation of :func:`segment_attention_mass_ref`.

    Args:
        q: [num_q, num_heads, head_dim], last dim contiguous.
        k: [num_kv, num_kv_heads, head_dim], last dim contiguous; row j is position j.
        q_positions: [num_q] int64 positions, each < num_kv (any order).
        scale: Softmax scale.
        cu_segments: [num_segments + 1] int64 key-segment boundaries.
        tiling: Launch settings; default :func:`_default_tiling`.

    Returns:
        mass [num_q, num_heads, num_segments] float32 on q's device, as the twin returns it.
    """
    return _launch_attention(q, k, k, q_positions, scale, cu_segments, tiling)


def selective_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_positions: torch.Tensor,
    scale: float,
    *,
    query_block: int = 128,
    backend: Backend = "auto",
    key_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of selected queries over the fused KV (see module docstring).

    Args:
        q: [num_q, num_heads, head_dim] queries after RoPE.
        k: [num_kv, num_kv_heads, head_dim] keys after RoPE; row j is position j.
        v: [num_kv, num_kv_heads, head_dim] values.
        q_positions: [num_q] int64 ascending absolute positions of the queries.
        scale: Softmax scale, usually head_dim ** -0.5.
        query_block: Queries per block of the torch twin.
        backend: Kernel backend ("auto", "triton" or "torch").
        key_bias: [num_kv] float added to every query's logit of each key (attention
            rescaling of reused KV); None: no bias. Runs on the torch twin.

    Returns:
        out [num_q, num_heads, head_dim] in q's dtype.

    The backend: the torch twin with ``key_bias``; else Triton where :func:`use_triton` says so;
    else vLLM-CPU's attention kernel where :func:`use_vllm_cpu` says so (``"auto"`` on the CPU,
    two or more queries); else the twin.
    """
    if key_bias is not None:
        return selective_attention_ref(q, k, v, q_positions, scale, query_block, key_bias)
    if use_triton(backend, q, k, v):
        return selective_attention_triton(q, k, v, q_positions, scale)
    if use_vllm_cpu(backend, q, k):
        return vllm_cpu_attention.selective_attention_vllm_cpu(q, k, v, q_positions, scale)
    return selective_attention_ref(q, k, v, q_positions, scale, query_block)


def prepare_selective_attention(backend: Backend, device: torch.device, head_dim: int) -> None:
    """Load the kernel :func:`selective_attention` will take on ``device``, before the first call.

    With ``backend="auto"`` on the CPU and a head size vLLM-CPU's kernel supports, this imports
    vLLM's kernels now (about 2 s) rather than in the first request; otherwise it does nothing.
    """
    if (
        backend == "auto"
        and device.type == "cpu"
        and vllm_cpu_attention.supports_head_dim(head_dim)
    ):
        vllm_cpu_attention.available()


def segment_attention_mass(
    q: torch.Tensor,
    k: torch.Tensor,
    q_positions: torch.Tensor,
    scale: float,
    cu_segments: torch.Tensor,
    *,
    query_block: int = 128,
    backend: Backend = "auto",
) -> torch.Tensor:
    """Attention probability mass of each query that falls in each key segment.

    Args:
        q: [num_q, num_heads, head_dim] queries after RoPE.
        k: [num_kv, num_kv_heads, head_dim] keys after RoPE; row j is position j.
        q_positions: [num_q] int64 ascending absolute positions of the queries.
        scale: Softmax scale.
        cu_segments: [num_segments + 1] int64 key-segment boundaries (first 0, last >= num_kv).
        query_block: Queries per block of the torch twin.
        backend: Kernel backend ("auto", "triton" or "torch").

    Returns:
        mass [num_q, num_heads, num_segments] float32 on q's device; each row sums to 1.
        Callers reduce over heads before copying it anywhere (at 32K queries and 64 segments
        it is 268 MB).
    """
    if use_triton(backend, q, k):
        return segment_attention_mass_triton(q, k, q_positions, scale, cu_segments)
    return segment_attention_mass_ref(q, k, q_positions, scale, cu_segments, query_block)


def _blocked_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_positions: torch.Tensor,
    scale: float,
    query_block: int,
    key_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Masked SDPA over query blocks; each block reads keys up to its last position only."""
    num_q, num_heads, _ = q.shape
    num_kv = k.shape[0]
    if num_q == 1 and q.dtype == torch.float32:
        kv_len = int(q_positions[0]) + 1
        bias = None if key_bias is None else key_bias[:kv_len]
        return _single_query_attention(q, k[:kv_len], v[:kv_len], scale, bias)
    # SDPA's fused CPU kernels need a batch dimension; 3-D inputs take its slow math path.
    k_heads, v_heads = k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    if key_bias is None and _is_full_causal(q_positions, num_kv):
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None], k_heads, v_heads, is_causal=True, scale=scale, enable_gqa=True
        )
        return out[0].transpose(0, 1)
    out = torch.empty(num_q, num_heads, v.shape[-1], dtype=q.dtype, device=q.device)
    for start in range(0, num_q, query_block):
        end = min(start + query_block, num_q)
        positions = q_positions[start:end]
        kv_len = int(positions[-1]) + 1  # keys past the block's last position are never visible
        visible = torch.arange(kv_len, device=q.device)[None, :] <= positions[:, None]
        mask: torch.Tensor | None = None if end - start == 1 else visible
        if key_bias is not None:  # additive: the bias where visible, -inf after the position
            bias = key_bias[:kv_len].to(q.dtype)[None, :].expand(end - start, kv_len)
            mask = bias.masked_fill(~visible, -math.inf)
        block_out = F.scaled_dot_product_attention(
            q[start:end].transpose(0, 1)[None],
            k_heads[:, :, :kv_len],
            v_heads[:, :, :kv_len],
            attn_mask=mask,
            scale=scale,
            enable_gqa=True,
        )
        out[start:end] = block_out[0].transpose(0, 1)
    return out


def _single_query_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    key_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query (a decoding step) over every key: two batched matmuls, the heads grouped.

    Each KV head's queries multiply its keys together, so the keys and values are read once
    per head. On head-major KV (as :class:`~adarag.engine.kv_cache.KVCache` stores it) this is
    about twice as fast as SDPA's fused CPU kernel for one float32 query (28.9 vs 13.0 ms per
    step over SmolLM2's 30 layers at 3.7K keys, two EPYC cores). Other dtypes keep SDPA: the
    CPU's bfloat16 matmul would round the scores to bfloat16.

    Args:
        q: [1, num_heads, head_dim].
        k: [num_kv, num_kv_heads, head_dim], every key visible.
        v: [num_kv, num_kv_heads, head_dim].
        scale: Softmax scale.
        key_bias: [num_kv] added to the logits, or None.
    """
    _, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    grouped = q[0].reshape(num_kv_heads, num_heads // num_kv_heads, head_dim)
    scores = torch.bmm(grouped, k.permute(1, 2, 0)) * scale  # [kv heads, group, num_kv]
    if key_bias is not None:
        scores = scores + key_bias.to(scores.dtype)
    probs = torch.softmax(scores, dim=-1)
    return torch.bmm(probs, v.transpose(0, 1)).reshape(1, num_heads, head_dim)


def _is_full_causal(q_positions: torch.Tensor, num_kv: int) -> bool:
    # Ascending unique positions 0..num_kv-1 are exactly a full causal prefill.
    num_q = q_positions.numel()
    return num_q == num_kv and int(q_positions[0]) == 0 and int(q_positions[-1]) == num_kv - 1
