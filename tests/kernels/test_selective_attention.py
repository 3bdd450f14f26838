"""selective_attention and segment_attention_mass: the Triton kernel against the twins, and the
absolute-position mask and mass properties of both."""

from __future__ import annotations

import pytest
import torch

from adarag.kernels import segment_attention_mass, selective_attention
from adarag.kernels.selective_attention import (
    AttentionTiling,
    segment_attention_mass_ref,
    segment_attention_mass_triton,
    selective_attention_ref,
    selective_attention_triton,
)
from tests.kernels.conftest import DTYPES, TOLERANCES, assert_close

SMALL_TILES = AttentionTiling(block_m=16, block_n=16, num_warps=4, num_stages=1)
# (num_heads, num_kv_heads, head_dim): GQA ratios 1, 2, 4 and SmolLM2's 9 over 3; head_dim 80
# is padded to 128 columns.
HEADS = [(4, 4, 16), (4, 2, 32), (8, 2, 16), (9, 3, 64), (2, 1, 80)]
# (num_kv, query positions) around the 16-key and 16-row tile boundaries
CASES = {
    "one_key": (1, [0]),
    "full_15": (15, list(range(15))),
    "full_17": (17, list(range(17))),
    "last_only_16": (16, [15]),
    "first_only_33": (33, [0]),
    "sparse_31": (31, [2, 3, 15, 16, 17, 29, 30]),
    "sparse_33": (33, [0, 5, 14, 15, 16, 31, 32]),
    "tail_49": (49, list(range(30, 49))),
}


def _rotating_dtypes(cases, heads):
    """Every (case, heads) pair once, the dtype rotating so that each meets every GQA shape."""
    return [
        pytest.param(
            case,
            head,
            DTYPES[(i + j) % len(DTYPES)],
            id=f"{case}-{head}-{DTYPES[(i + j) % len(DTYPES)]}",
        )
        for i, case in enumerate(cases)
        for j, head in enumerate(heads)
    ]


def _inputs(heads, num_kv, positions, dtype, device):
    num_heads, num_kv_heads, head_dim = heads
    q = torch.randn(len(positions), num_heads, head_dim).to(dtype).to(device)
    k = torch.randn(num_kv, num_kv_heads, head_dim).to(dtype).to(device)
    v = torch.randn(num_kv, num_kv_heads, head_dim).to(dtype).to(device)
    q_positions = torch.tensor(positions, dtype=torch.int64, device=device)
    return q, k, v, q_positions, head_dim**-0.5


def _cu_segments(num_kv, device, bounds=(5, 12, 13)):
    inner = [b for b in bounds if b < num_kv]
    return torch.tensor([0, *inner, num_kv], dtype=torch.int64, device=device)


@pytest.mark.parametrize(("case", "heads", "dtype"), _rotating_dtypes(CASES, HEADS))
def test_output_matches_twin(case, heads, dtype, device):
    num_kv, positions = CASES[case]
    q, k, v, q_positions, scale = _inputs(heads, num_kv, positions, dtype, device)
    out = selective_attention_triton(q, k, v, q_positions, scale, tiling=SMALL_TILES)
    assert out.dtype == dtype and out.shape == q.shape
    assert_close(out, selective_attention_ref(q, k, v, q_positions, scale), dtype)


@pytest.mark.parametrize(
    ("case", "heads", "dtype"), _rotating_dtypes(["full_17", "sparse_33", "tail_49"], HEADS[1:4])
)
def test_mass_matches_twin(case, heads, dtype, device):
    num_kv, positions = CASES[case]
    q, k, _, q_positions, scale = _inputs(heads, num_kv, positions, dtype, device)
    cu = _cu_segments(num_kv, device)
    mass = segment_attention_mass_triton(q, k, q_positions, scale, cu, tiling=SMALL_TILES)
    assert mass.dtype == torch.float32 and mass.device == q.device
    assert_close(mass, segment_attention_mass_ref(q, k, q_positions, scale, cu), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dispatchers_run_kernel_with_default_tiles(dtype, device):
    # 9 heads over 3: 3 * 50 rows span two 128-row tiles; 150 keys span several key tiles
    positions = sorted(torch.randperm(150)[:49].tolist() + [149])
    q, k, v, q_positions, scale = _inputs((9, 3, 64), 150, positions, dtype, device)
    out = selective_attention(q, k, v, q_positions, scale, backend="triton")
    assert_close(out, selective_attention_ref(q, k, v, q_positions, scale), dtype)
    cu = _cu_segments(150, device, bounds=(7, 60, 61, 100))
    mass = segment_attention_mass(q, k, q_positions, scale, cu, backend="triton")
    assert_close(mass, segment_attention_mass_ref(q, k, q_positions, scale, cu), dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_full_causal_prefill_with_default_tiles_at_head_dim_128(dtype, device):
    # a full prefill (every position a query) at Llama-3-8B's head shape, on the tiling the
    # dispatcher picks for 16-bit head_dim 128 (block rows hold several tokens of 4 heads)
    num_kv = 200
    q, k, v, q_positions, scale = _inputs((8, 2, 128), num_kv, list(range(num_kv)), dtype, device)
    out = selective_attention(q, k, v, q_positions, scale, backend="triton")
    assert_close(out, selective_attention_ref(q, k, v, q_positions, scale), dtype)


def test_mass_with_more_segments_than_head_dim(device):
    # 20 segments over head_dim 16: the twin takes two passes, the kernel one 32-column tile;
    # segment 3 is empty and the last bound lies past the keys
    q, k, _, q_positions, scale = _inputs(
        (4, 2, 16), 45, [3, 20, 21, 40, 44], torch.float32, device
    )
    bounds = [0, 1, 2, 4, 4, *range(6, 36, 2), 50]
    cu = torch.tensor(bounds, dtype=torch.int64, device=device)
    mass = segment_attention_mass_triton(q, k, q_positions, scale, cu, tiling=SMALL_TILES)
    assert mass.shape == (5, 4, 20)
    assert_close(mass, segment_attention_mass_ref(q, k, q_positions, scale, cu), torch.float32)
    assert torch.all(mass[:, :, 3] == 0)


def test_kernel_reads_strided_views(device):
    # q is a view into a fused projection, k and v rows of a [capacity, heads, dim] cache
    qkv = torch.randn(7, 6 + 2 + 2, 32, device=device)
    q = qkv[:, :6]
    cache_k, cache_v = torch.randn(2, 50, 2, 32, device=device)
    k, v = cache_k[:40], cache_v[:40]
    q_positions = torch.tensor([0, 9, 16, 17, 30, 38, 39], device=device)
    out = selective_attention_triton(q, k, v, q_positions, 0.2, tiling=SMALL_TILES)
    assert_close(out, selective_attention_ref(q, k, v, q_positions, 0.2), torch.float32)


def _naive_attention(q, k, v, q_positions, scale):
    """Softmax over every key at or before each query's position, in float64."""
    group = q.shape[1] // k.shape[1]
    keys = k.double().repeat_interleave(group, dim=1)  # [num_kv, num_heads, head_dim]
    values = v.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->qhk", q.double(), keys) * scale
    later = torch.arange(k.shape[0])[None, :] > q_positions.cpu()[:, None]
    scores = scores.masked_fill(later[:, None, :], float("-inf"))
    return torch.einsum("qhk,khd->qhd", scores.softmax(-1), values)


@pytest.mark.parametrize("head_major", [False, True], ids=["token_major", "head_major"])
@pytest.mark.parametrize("heads", HEADS, ids=str)
@pytest.mark.parametrize("position", [0, 17, 40])
def test_one_query_matches_naive_attention(position, heads, head_major):
    # a decoding step: the torch twin's grouped-matmul path for one float32 query, on the token-
    # major layout of a chunk and on the head-major layout of the fused cache (KVCache's views)
    q, k, v, q_positions, scale = _inputs(heads, 41, [position], torch.float32, "cpu")
    if head_major:
        k = k.transpose(0, 1).contiguous().transpose(0, 1)
        v = v.transpose(0, 1).contiguous().transpose(0, 1)
    out = selective_attention(q, k, v, q_positions, scale, backend="torch")
    expected = _naive_attention(q, k, v, q_positions, scale)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("heads", [(4, 4, 16), (9, 3, 64)], ids=str)
def test_mask_never_shows_a_later_key(heads, backend, device):
    # garbage in every key and value after position 20 leaves queries at <= 20 unchanged, exactly
    positions = [0, 4, 15, 16, 20, 21, 33, 40]
    q, k, v, q_positions, scale = _inputs(heads, 41, positions, torch.float32, device)
    cu = _cu_segments(41, device, bounds=(10, 25))
    garbage_k, garbage_v = k.clone(), v.clone()
    garbage_k[21:] = 50 * torch.randn_like(k[21:])
    garbage_v[21:] = 1e4 * torch.randn_like(v[21:])
    seen = q_positions <= 20

    def run(keys, values):
        out = selective_attention(q, keys, values, q_positions, scale, backend=backend)
        mass = segment_attention_mass(q, keys, q_positions, scale, cu, backend=backend)
        return out.cpu(), mass

    (out, mass), (garbage_out, garbage_mass) = run(k, v), run(garbage_k, garbage_v)
    assert torch.equal(out[seen.cpu()], garbage_out[seen.cpu()])
    assert torch.equal(mass[seen.cpu()], garbage_mass[seen.cpu()])
    assert not torch.equal(out[~seen.cpu()], garbage_out[~seen.cpu()])


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_segment_masses_sum_to_one(backend, dtype, device):
    q, k, _, q_positions, scale = _inputs((9, 3, 64), 33, [0, 1, 13, 16, 32], dtype, device)
    cu = _cu_segments(33, device)
    mass = segment_attention_mass(q, k, q_positions, scale, cu, backend=backend)
    assert_close(mass.sum(-1), torch.ones(5, 9), dtype)
    assert torch.all(mass >= 0)
    # a query never puts mass on a segment that starts after it
    starts = cu[:-1].cpu()
    is_later = q_positions.cpu()[:, None] < starts[None, :]  # [num_q, num_segments]
    assert torch.all(mass.permute(0, 2, 1)[is_later] == 0)


def test_tolerance_table_covers_every_dtype():
    assert set(TOLERANCES) == set(DTYPES)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("ratio", [0.05, 0.3])
def test_llama_8b_shapes_match_twin_on_gpu(ratio, dtype):
    # 32 heads over 8, head_dim 128, 4K context; the query suffix is always selected
    num_kv = 4096
    chosen = torch.randperm(num_kv - 32)[: int(ratio * num_kv)].sort().values
    positions = torch.cat((chosen, torch.arange(num_kv - 32, num_kv))).tolist()
    q, k, v, q_positions, scale = _inputs((32, 8, 128), num_kv, positions, dtype, "cuda")
    out = selective_attention(q, k, v, q_positions, scale, backend="triton")
    assert_close(out, selective_attention_ref(q, k, v, q_positions, scale), dtype)
    cu = torch.tensor([0, 100, *range(612, num_kv, 512), num_kv], device="cuda")
    mass = segment_attention_mass(q, k, q_positions, scale, cu, backend="triton")
    assert_close(mass, segment_attention_mass_ref(q, k, q_positions, scale, cu), dtype)
