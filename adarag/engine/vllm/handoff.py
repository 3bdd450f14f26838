"""The hand-over of fused KV from the generator to vLLM's worker-side connector.

The generator computes a prompt's fused KV with adarag's fusion loop, puts it here under a fresh
handoff id, and submits the prompt to vLLM with ``kv_transfer_params`` naming that id and the
number of context tokens it covers. vLLM's scheduler-side connector reads only those params; the
worker-side connector, bound to this object once at start-up, takes the tensors and writes them
into the paged KV blocks. Both sides live in the generator's process (vLLM runs in-process).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import torch

PARAMS_KEY = "adarag"
"""Key of adarag's entry in a request's ``kv_transfer_params``."""


@dataclass(frozen=True)
class HandoffRequest:
    """What a request asks of the connector.

    Attributes:
        handoff_id: Where the fused KV waits in the :class:`KVHandoff`.
        num_context_tokens: Leading prompt tokens whose KV the connector supplies.
    """

    handoff_id: str
    num_context_tokens: int

    def to_params(self) -> dict[str, Any]:
        """The request's ``kv_transfer_params``."""
        return {
            PARAMS_KEY: {
                "handoff_id": self.handoff_id,
                "num_context_tokens": self.num_context_tokens,
            }
        }

    @classmethod
    def from_params(cls, params: dict[str, Any] | None) -> HandoffRequest | None:
        """Parse ``kv_transfer_params``; None when the request carries no adarag entry."""
        entry = (params or {}).get(PARAMS_KEY)
        if entry is None:
            return None
        return cls(str(entry["handoff_id"]), int(entry["num_context_tokens"]))


@dataclass(frozen=True)
class FusedContext:
    """Fused KV of a prompt's context tokens, keys after RoPE at positions ``0..num_tokens-1``.

    Attributes:
        k: [num_layers, num_tokens, num_kv_heads, head_dim].
        v: [num_layers, num_tokens, num_kv_heads, head_dim].
    """

    k: torch.Tensor
    v: torch.Tensor

    def __post_init__(self) -> None:
        assert self.k.shape == self.v.shape, f"k {self.k.shape} and v {self.v.shape} differ"
        assert self.k.dim() == 4, f"expected [layers, tokens, heads, dim], got {self.k.shape}"

    @property
    def num_tokens(self) -> int:
        """Context tokens covered."""
        return int(self.k.shape[1])


class KVHandoff:
    """Fused contexts waiting for vLLM's worker connector, and how many rows it wrote for each.

    Thread-safe: the generator puts and drops entries, the connector reads them inside vLLM's
    step, possibly from another thread of the same process.
    """

    def __init__(self) -> None:
        self._contexts: dict[str, FusedContext] = {}
        self._num_written: dict[str, int] = {}
        self._lock = threading.Lock()

    def put(self, handoff_id: str, context: FusedContext) -> None:
        """Offer ``context`` under a new ``handoff_id``."""
        with self._lock:
            assert handoff_id not in self._contexts, f"handoff id {handoff_id} reused"
            self._contexts[handoff_id] = context
            self._num_written[handoff_id] = 0

    def get(self, handoff_id: str) -> FusedContext | None:
        """The context under ``handoff_id``, or None when it was dropped."""
        with self._lock:
            return self._contexts.get(handoff_id)

    def record_written(self, handoff_id: str, num_tokens: int) -> None:
        """Count ``num_tokens`` rows written into vLLM's paged cache for ``handoff_id``."""
        with self._lock:
            if handoff_id in self._num_written:
                self._num_written[handoff_id] += num_tokens

    def num_written(self, handoff_id: str) -> int:
        """Rows written so far for ``handoff_id`` (0 once dropped)."""
        with self._lock:
            return self._num_written.get(handoff_id, 0)

    def drop(self, handoff_id: str) -> None:
        """Forget ``handoff_id`` (its request finished or was aborted)."""
        with self._lock:
            self._contexts.pop(handoff_id, None)
            self._num_written.pop(handoff_id, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._contexts)
