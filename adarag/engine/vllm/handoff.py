"""The hand-over of fused KV from the engine to vLLM's worker-side connector.

The engine computes a prompt's fused KV with adarag's fusion loop, puts it here under a fresh
handoff id, and submits the prompt to vLLM with ``kv_transfer_params`` naming that id and the
number of context tokens it covers. vLLM's scheduler-side connector reads only those params; the
worker-side connector, bound to this object once at start-up, takes the tensors and writes them
into the paged KV blocks. Both sides live in the engine's process (vLLM runs in-process).
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

PARAMS_KEY = "adarag"
"""Key of adarag's entry in a request's ``kv_transfer_params``."""

HANDOFF_ID = re.compile(r"^[0-9a-f]{32}$")
"""A handoff id: 32 lowercase hex digits (``uuid4().hex``); nothing else names a file or key."""

MAX_CONTEXT_TOKENS = 1 << 31
"""More context tokens than any request carries; a larger count is malformed."""


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
    def from_params(cls, params: object) -> HandoffRequest | None:
        """The request's hand-over; None when it carries no adarag entry or a malformed one.

        Never raises, whatever a client put in ``kv_transfer_params``: :func:`read_params`.
        """
        return read_params(params)[0]


def read_params(params: object) -> tuple[HandoffRequest | None, str | None]:
    """The hand-over ``params`` ask for, and why they are malformed (None when they are not).

    The one parser of ``kv_transfer_params`` on the connector's path: any value a client sends
    (JSON of any shape, or none) gives either a hand-over with a well-formed id and a count in
    ``1..MAX_CONTEXT_TOKENS``, or none; it never raises.
    """
    if params is None:
        return None, None
    if not isinstance(params, Mapping):
        return None, f"kv_transfer_params is of type {type(params).__name__}, not an object"
    entry = params.get(PARAMS_KEY)
    if entry is None:
        return None, None
    if not isinstance(entry, Mapping):
        return None, f"its {PARAMS_KEY!r} entry is of type {type(entry).__name__}, not an object"
    handoff_id = entry.get("handoff_id")
    if not isinstance(handoff_id, str) or not HANDOFF_ID.match(handoff_id):
        return None, "handoff_id is not 32 lowercase hex digits"
    count = entry.get("num_context_tokens")
    if count is None:
        return None, "num_context_tokens is missing"
    if not isinstance(count, int) or isinstance(count, bool):
        return None, f"num_context_tokens is of type {type(count).__name__}, not a whole number"
    if not 0 < count <= MAX_CONTEXT_TOKENS:
        return None, f"num_context_tokens is outside 1..{MAX_CONTEXT_TOKENS}"
    return HandoffRequest(handoff_id, count), None


@dataclass(frozen=True)
class HandoffBinding:
    """What a hand-over's KV belongs to: its id and the exact prompt tokens it was computed for.

    Attributes:
        handoff_id: The hand-over's id.
        prompt_digest: :func:`prompt_digest` of the context tokens.
        num_tokens: Context tokens (rows of KV).
    """

    handoff_id: str
    prompt_digest: str
    num_tokens: int

    @classmethod
    def of(cls, handoff: HandoffRequest, token_ids: Sequence[int]) -> HandoffBinding:
        """The binding of ``handoff`` in a request whose prompt is ``token_ids``."""
        context = token_ids[: handoff.num_context_tokens]
        return cls(handoff.handoff_id, prompt_digest(context), handoff.num_context_tokens)


def prompt_digest(token_ids: Sequence[int]) -> str:
    """SHA-256 of token ids, as hex: binds a hand-over to the prompt it was computed for."""
    return hashlib.sha256(",".join(str(int(i)) for i in token_ids).encode()).hexdigest()


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

    Thread-safe: the engine puts and drops entries, the connector reads them inside vLLM's
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
