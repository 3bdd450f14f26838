"""vLLM-CPU's attention kernel behind selective_attention: the same op as the torch twin.

The kernel (``adarag.kernels.vllm_cpu_attention``) is chosen by the ``selective_attention``
dispatcher with ``backend="auto"`` on the CPU; the runner only passes its backend on.

The kernel runs each run of consecutive query positions as one request bottom-right aligned at
its last position; these tests check that this reproduces the absolute-position causal mask for
full prefills, scattered selections, runs across the kernel's 128-key pages, GQA, both dtypes and
the head-major views of the engine's KV cache.
"""

from __future__ import annotations

import pytest
import torch

from adarag.engine.prefill_request import PrefillRequest
from adarag.kernels import selective_attention
from adarag.kernels import vllm_cpu_attention as cpu_attention
from adarag.kernels.selective_attention import selective_attention_ref
from adarag.kernels.vllm_cpu_attention import selective_attention_vllm_cpu
from adarag.schema import GenerationParams
from tests.kernels.conftest import assert_close
from tests.unit.engine.helpers import CHUNKS, QUESTION, layout_of, load_engine

pytestmark = pytest.mark.skipif(
    not cpu_attention.available(), reason="vLLM-CPU is not installed on this x86 machine"
)

HEADS = [(4, 4, 32), (9, 3, 64), (14, 2, 64), (2, 1, 80), (4, 2, 128)]
CASES = {
    "full_7": (7, list(range(7))),
    "full_300": (300, list(range(300))),  # three pages of 128 keys
    "scattered_300": (300, [0, 1, 2, 50, 127, 128, 129, 200, *range(280, 300)]),
    "tail_only": (260, list(range(250, 260))),
    "first_and_last": (129, [0, 128]),
}


def _inputs(heads, num_kv, positions, dtype, head_major=False):
    num_heads, num_kv_heads, head_dim = heads
    q = torch.randn(len(positions), num_heads, head_dim).to(dtype)
    if head_major:  # KVCache's layout: [kv_heads, capacity, dim] memory, token-order views
        capacity = num_kv + 37
        k = torch.randn(num_kv_heads, capacity, head_dim).to(dtype).transpose(0, 1)[:num_kv]
        v = torch.randn(num_kv_heads, capacity, head_dim).to(dtype).transpose(0, 1)[:num_kv]
    else:
        k = torch.randn(num_kv, num_kv_heads, head_dim).to(dtype)
        v = torch.randn(num_kv, num_kv_heads, head_dim).to(dtype)
    return q, k, v, torch.tensor(positions, dtype=torch.int64), head_dim**-0.5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("heads", HEADS, ids=str)
@pytest.mark.parametrize("case", CASES)
def test_matches_twin(case, heads, dtype):
    num_kv, positions = CASES[case]
    q, k, v, q_positions, scale = _inputs(heads, num_kv, positions, dtype)
    out = selective_attention_vllm_cpu(q, k, v, q_positions, scale)
    assert out.dtype == dtype and out.shape == q.shape
    assert_close(out, selective_attention_ref(q, k, v, q_positions, scale), dtype)


def test_reads_head_major_cache_views():
    q, k, v, q_positions, scale = _inputs(
        (9, 3, 64), 300, CASES["scattered_300"][1], torch.float32, head_major=True
    )
    assert not k.is_contiguous()
    out = selective_attention_vllm_cpu(q, k, v, q_positions, scale)
    assert_close(out, selective_attention_ref(q, k, v, q_positions, scale), torch.float32)


def test_later_keys_never_change_a_query():
    # every query's output depends only on keys at or before its position
    positions = [3, 4, 5, 90, 200, 201]
    q, k, v, q_positions, scale = _inputs((9, 3, 64), 260, positions, torch.float32)
    before = selective_attention_vllm_cpu(q, k, v, q_positions, scale)
    k2, v2 = k.clone(), v.clone()
    k2[6:] += 5.0
    v2[6:] -= 3.0
    after = selective_attention_vllm_cpu(q, k2, v2, q_positions, scale)
    assert torch.equal(after[:3], before[:3])
    assert not torch.allclose(after[3:], before[3:])


def _spy_on_the_kernel(monkeypatch) -> list[int]:
    calls = []
    real = cpu_attention.selective_attention_vllm_cpu

    def spy(*args):
        calls.append(args[0].shape[0])
        return real(*args)

    monkeypatch.setattr(cpu_attention, "selective_attention_vllm_cpu", spy)
    return calls


def test_dispatcher_takes_the_kernel_only_with_auto(monkeypatch):
    # "auto" on the CPU: the kernel; "torch", a key bias or one query (a decoding step): the twin
    calls = _spy_on_the_kernel(monkeypatch)
    q, k, v, q_positions, scale = _inputs((9, 3, 64), 40, list(range(30, 40)), torch.float32)
    twin = selective_attention_ref(q, k, v, q_positions, scale)
    assert_close(selective_attention(q, k, v, q_positions, scale), twin, torch.float32)
    assert calls == [10]
    selective_attention(q, k, v, q_positions, scale, backend="torch")
    selective_attention(q, k, v, q_positions, scale, key_bias=torch.zeros(40))
    selective_attention(q[:1], k, v, q_positions[:1], scale)
    assert calls == [10]


def test_runner_uses_the_kernel_with_auto_and_the_twin_with_torch(
    monkeypatch, tiny_checkpoints, tiny_config
):
    # a head_dim-32 model: prefill attention goes through the kernel with kernels.backend="auto"
    # (one call per layer), never with "torch", and both give the same logits; decoding steps
    # (one query each) stay on the twin
    calls = _spy_on_the_kernel(monkeypatch)
    logits = {}
    for backend in ("auto", "torch"):
        config = tiny_config(tiny_checkpoints["llama-hd32"], kernels={"backend": backend})
        engine = load_engine(config)
        layout = layout_of(engine, QUESTION, CHUNKS)
        before = len(calls)
        output = engine.prefill(PrefillRequest(layout, max_new_tokens=3))
        tokens = list(engine.decode_tokens(layout, output, GenerationParams(max_new_tokens=3)))
        assert tokens
        logits[backend] = output.logits
        num_layers = engine.spec.num_layers
        assert len(calls) - before == (num_layers if backend == "auto" else 0)
    assert all(num_queries > 1 for num_queries in calls)
    torch.testing.assert_close(logits["auto"], logits["torch"], atol=1e-5, rtol=1e-5)


def test_unsupported_head_dim_falls_back_to_the_twin():
    q, k, _, _, _ = _inputs((4, 2, 16), 10, list(range(10)), torch.float32)
    assert not cpu_attention.can_run(q, k)
