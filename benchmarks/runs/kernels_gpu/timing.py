"""Timing on a GPU (CUDA events, the L2 cache flushed) and the check against the torch twin."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

QUERY_SUFFIX_TOKENS = 32
BF16_TOLERANCE = {"atol": 2e-2, "rtol": 2e-2}


class Timer:
    """Median milliseconds per call: CUDA events on a GPU, wall clock elsewhere (smoke runs)."""

    def __init__(self, device: torch.device, warmup: int, reps: int) -> None:
        self.device, self.warmup, self.reps = device, warmup, reps
        self.is_cuda = device.type == "cuda"
        # writing 256 MB evicts the H100's 50 MB L2, so no call reuses the previous one's reads
        flush_elements = 64 * 2**20 if self.is_cuda else 1
        self.flush_buffer = torch.empty(flush_elements, dtype=torch.int32, device=device)

    def __call__(self, fn: Callable[[], Any]) -> float:
        for _ in range(self.warmup):
            fn()
        times = []
        for _ in range(self.reps):
            self.flush_buffer.zero_()
            if self.is_cuda:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
            else:
                started = time.perf_counter()
                fn()
                times.append(1e3 * (time.perf_counter() - started))
        return statistics.median(times)


def check(name: str, actual: torch.Tensor, expected: torch.Tensor, **tolerance: float) -> None:
    """Stop the run when a variant disagrees with the twin."""
    try:
        torch.testing.assert_close(actual.float().cpu(), expected.float().cpu(), **tolerance)
    except AssertionError as err:
        raise SystemExit(f"{name}: output differs from the twin, not timing it\n{err}") from err


def selected_positions(num_kv: int, ratio: float, device: torch.device) -> torch.Tensor:
    """Sorted positions of ``ceil(ratio * num_kv)`` queries, always holding the query suffix."""
    num_q = max(QUERY_SUFFIX_TOKENS, math.ceil(ratio * num_kv))
    suffix = torch.arange(num_kv - QUERY_SUFFIX_TOKENS, num_kv)
    chosen = torch.randperm(num_kv - QUERY_SUFFIX_TOKENS)[: num_q - QUERY_SUFFIX_TOKENS]
    return torch.cat((chosen.sort().values, suffix)).to(device)
