"""The other kernels against their twins: segment attention mass, RoPE delta, KV scatter, lens."""

from __future__ import annotations

import argparse
import json
from functools import partial

import torch

from adarag.kernels.kv_scatter import kv_scatter_ref, kv_scatter_triton
from adarag.kernels.logit_lens import logit_lens_ref, logit_lens_triton
from adarag.kernels.rope_delta import rope_delta_ref, rope_delta_triton
from adarag.kernels.selective_attention import (
    segment_attention_mass_ref,
    segment_attention_mass_triton,
)
from runs.kernels_gpu.timing import BF16_TOLERANCE, Timer, check, selected_positions

SEGMENT_TOKENS = 512


def bench_mass(args: argparse.Namespace, timer: Timer, device: torch.device) -> list[dict]:
    rows = []
    for num_kv in args.contexts:
        q = torch.randn(num_kv, args.heads, args.head_dim, dtype=args.dtype, device=device)
        k = torch.randn(num_kv, args.kv_heads, args.head_dim, dtype=args.dtype, device=device)
        positions = torch.arange(num_kv, device=device)
        bounds = list(range(0, num_kv, SEGMENT_TOKENS)) + [num_kv]
        cu = torch.tensor(bounds, dtype=torch.int64, device=device)
        scale = args.head_dim**-0.5
        twin = segment_attention_mass_ref(q, k, positions, scale, cu)
        runs = {
            "triton": partial(segment_attention_mass_triton, q, k, positions, scale, cu),
            "twin": partial(segment_attention_mass_ref, q, k, positions, scale, cu),
        }
        check("segment_attention_mass", runs["triton"](), twin, atol=1e-2, rtol=0)
        row = {"context": num_kv, "num_q": num_kv, "num_segments": len(bounds) - 1}
        row.update({f"{name}_ms": timer(run) for name, run in runs.items()})
        # what every head's mass costs when copied to the CPU whole (the op's old contract)
        row["triton_to_cpu_ms"] = timer(lambda run=runs["triton"]: run().cpu())
        row["speedup_vs_twin"] = row["twin_ms"] / row["triton_ms"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def bench_rope(args: argparse.Namespace, timer: Timer, device: torch.device) -> list[dict]:
    rows = []
    head_dim = args.head_dim
    inv_freq = 1.0 / 500000.0 ** (torch.arange(0, head_dim, 2, device=device) / head_dim)
    for num_tokens in args.contexts:
        shape = (args.layers, num_tokens, args.kv_heads, head_dim)
        k = torch.randn(shape, dtype=args.dtype, device=device)
        delta = torch.randint(-num_tokens, num_tokens, (num_tokens,), device=device)
        runs = {
            "triton": partial(rope_delta_triton, k, delta, inv_freq),
            "twin": partial(rope_delta_ref, k, delta, inv_freq),
        }
        check("rope_delta", runs["triton"](), runs["twin"](), **BF16_TOLERANCE)
        row = {"context": num_tokens, "layers": args.layers}
        row.update({f"{name}_ms": timer(run) for name, run in runs.items()})
        row["speedup_vs_twin"] = row["twin_ms"] / row["triton_ms"]
        row["triton_gb_per_s"] = 2 * k.numel() * k.element_size() / row["triton_ms"] / 1e6
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def bench_scatter(args: argparse.Namespace, timer: Timer, device: torch.device) -> list[dict]:
    rows = []
    for num_slots in args.contexts:
        k_cache = torch.zeros(num_slots, args.kv_heads, args.head_dim, dtype=args.dtype)
        k_cache, v_cache = k_cache.to(device), k_cache.clone().to(device)
        for ratio in args.ratios:
            positions = selected_positions(num_slots, ratio, device)
            shape = (positions.numel(), args.kv_heads, args.head_dim)
            k = torch.randn(shape, dtype=args.dtype, device=device)
            v = torch.randn_like(k)
            expected_k, expected_v = k_cache.clone(), v_cache.clone()
            kv_scatter_ref(expected_k, expected_v, k, v, positions)
            kv_scatter_triton(k_cache, v_cache, k, v, positions)
            check("kv_scatter k", k_cache, expected_k, atol=0, rtol=0)
            check("kv_scatter v", v_cache, expected_v, atol=0, rtol=0)
            runs = {
                "triton": partial(kv_scatter_triton, k_cache, v_cache, k, v, positions),
                "twin": partial(kv_scatter_ref, k_cache, v_cache, k, v, positions),
            }
            row = {"context": num_slots, "ratio": ratio, "num_tokens": positions.numel()}
            row.update({f"{name}_ms": timer(run) for name, run in runs.items()})
            row["speedup_vs_twin"] = row["twin_ms"] / row["triton_ms"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def bench_logit_lens(args: argparse.Namespace, timer: Timer, device: torch.device) -> list[dict]:
    hidden = 3 * torch.randn(args.lens_layers, args.hidden_size, device=device).to(args.dtype)
    norm_weight = torch.ones(args.hidden_size, dtype=args.dtype, device=device)
    lm_head = torch.randn(args.vocab, args.hidden_size, dtype=args.dtype, device=device) / 30
    runs = {
        "triton": partial(logit_lens_triton, hidden, norm_weight, 1e-5, lm_head),
        "twin": partial(logit_lens_ref, hidden, norm_weight, 1e-5, lm_head),
    }
    (kl, entropy), (twin_kl, twin_entropy) = runs["triton"](), runs["twin"]()
    check("logit_lens kl", kl, twin_kl, atol=1e-3, rtol=1e-4)
    check("logit_lens entropy", entropy, twin_entropy, atol=1e-3, rtol=1e-4)
    row = {"layers": args.lens_layers, "vocab": args.vocab, "hidden_size": args.hidden_size}
    row.update({f"{name}_ms": timer(run) for name, run in runs.items()})
    row["speedup_vs_twin"] = row["twin_ms"] / row["triton_ms"]
    row["triton_gb_per_s"] = lm_head.numel() * lm_head.element_size() / row["triton_ms"] / 1e6
    print(json.dumps(row), flush=True)
    return [row]
