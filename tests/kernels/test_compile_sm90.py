"""Every kernel compiles for an H100 (sm_90) with its default launch settings, without a GPU.

The interpreter checks the maths but not the GPU lowering (``tl.dot`` shape rules, layouts,
shared memory); Triton's NVIDIA backend compiles to a cubin on any machine. Runs in a subprocess
because ``TRITON_INTERPRET=1`` turns ``triton.jit`` into the interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from adarag.kernels._dispatch import is_triton_installed

H100_SHARED_MEMORY_BYTES = 232448

COMPILE_SCRIPT = r"""
import importlib, json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

def compile_kernel(module, pointer_types, constexprs, num_warps, num_stages):
    kernel = importlib.import_module(module)._compiled_kernel()
    signature = {
        name: "constexpr" if name.isupper() else pointer_types.get(name, "i32")
        for name in kernel.arg_names
    }
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    options = {"num_warps": num_warps, "num_stages": num_stages}
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    return {"shared": compiled.metadata.shared, "cubin_bytes": len(compiled.asm["cubin"])}

results = {}
for name, args in json.loads(sys.argv[1]).items():
    results[name] = compile_kernel(*args)
print(json.dumps(results))
"""

BF16_QKV = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "positions_ptr": "*i64"}
ATTENTION = {
    **BF16_QKV,
    "cu_segments_ptr": "*i64",
    "scale_log2": "fp32",
}
ATTENTION_CONSTANTS = {"GROUP_SIZE": 4, "HEAD_DIM": 128, "HEAD_DIM_PADDED": 128}
# Llama-3-8B shapes in bfloat16, each with the settings its wrapper picks by default
KERNELS = {
    "rope_delta": [
        "adarag.kernels.rope_delta",
        {"k_ptr": "*bf16", "out_ptr": "*bf16", "delta_ptr": "*i64", "inv_freq_ptr": "*fp32"},
        {"HALF_DIM": 64, "HALF_DIM_PADDED": 64, "BLOCK_TOKENS": 32},
        4,
        3,
    ],
    "kv_scatter": [
        "adarag.kernels.kv_scatter",
        {
            "k_cache_ptr": "*bf16",
            "v_cache_ptr": "*bf16",
            "k_ptr": "*bf16",
            "v_ptr": "*bf16",
            "positions_ptr": "*i64",
        },
        {"HEAD_DIM": 128, "HEAD_DIM_PADDED": 128, "BLOCK_ROWS": 16},
        4,
        3,
    ],
    "selective_attention": [
        "adarag.kernels.selective_attention",
        {**ATTENTION, "out_ptr": "*bf16"},
        {
            **ATTENTION_CONSTANTS,
            "OUT_DIM": 128,
            "BLOCK_M": 64,
            "BLOCK_N": 64,
            "WRITE_MASS": False,
            "DOT_PRECISION": "tf32",
            "DOT_IN_FP32": False,
        },
        4,
        3,
    ],
    "segment_attention_mass": [
        "adarag.kernels.selective_attention",
        {**ATTENTION, "out_ptr": "*fp32"},
        {
            **ATTENTION_CONSTANTS,
            "OUT_DIM": 16,
            "BLOCK_M": 128,
            "BLOCK_N": 64,
            "WRITE_MASS": True,
            "DOT_PRECISION": "tf32",
            "DOT_IN_FP32": False,
        },
        8,
        2,
    ],
    "logit_lens": [
        "adarag.kernels.logit_lens",
        {
            "x_ptr": "*fp32",
            "weight_ptr": "*bf16",
            "block_max_ptr": "*fp32",
            "block_sum_ptr": "*fp32",
            "block_gap_ptr": "*fp32",
            "block_final_ptr": "*fp32",
        },
        {"ROWS_PADDED": 16, "BLOCK_V": 128, "BLOCK_K": 32},
        8,
        3,
    ],
}


def test_kernels_compile_for_h100():
    if not is_triton_installed():
        pytest.skip("Triton is not installed")
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # Triton 3.9's default, without its warning
    result = subprocess.run(
        [sys.executable, "-c", COMPILE_SCRIPT, json.dumps(KERNELS)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    compiled = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(compiled) == set(KERNELS)
    for name, info in compiled.items():
        assert info["cubin_bytes"] > 0, name
        assert info["shared"] <= H100_SHARED_MEMORY_BYTES, f"{name} needs {info['shared']} B"
