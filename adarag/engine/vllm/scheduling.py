"""The scheduler side of adarag's connector: how many tokens it supplies, and where they go.

vLLM's connector API is prefix-only: the scheduler asks how many leading prompt tokens beyond
its own prefix-cache hit the connector can load. adarag answers with the context length it was
handed in ``kv_transfer_params`` (all prompt tokens before the last, which vLLM computes: to get
the first token's logits in process, or the KV of the first token the ``vllm serve`` front end
sampled), minus what vLLM already holds. After vLLM allocates blocks, the
loads of the step are turned into slot mappings for the worker side.

Plain Python over the few fields of vLLM's request and scheduler-output objects it reads, so it
is tested with stand-ins.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from adarag.engine.vllm.handoff import HandoffBinding, HandoffRequest, read_params

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class KVLoad:
    """One request's rows to write this step.

    Attributes:
        request_id: vLLM's request id.
        binding: The hand-over the rows come from, and the prompt it must have been made for.
        start: First prompt position to write.
        end: One past the last.
        slot_mapping: Paged-cache slot of each position ``start..end-1``.
    """

    request_id: str
    binding: HandoffBinding
    start: int
    end: int
    slot_mapping: tuple[int, ...]

    def __post_init__(self) -> None:
        assert 0 <= self.start < self.end, f"empty load [{self.start}, {self.end})"
        assert len(self.slot_mapping) == self.end - self.start, "one slot per position"

    @property
    def handoff_id(self) -> str:
        """Where the fused KV waits."""
        return self.binding.handoff_id


@dataclass
class _PendingLoad:
    binding: HandoffBinding
    num_external_tokens: int


@dataclass
class ConnectorScheduler:
    """Bookkeeping of the scheduler-side connector between allocation and the step's metadata.

    Every read of a request's ``kv_transfer_params`` goes through
    :func:`~adarag.engine.vllm.handoff.read_params`, which never raises: a malformed request
    (whatever a client sent) is computed by vLLM, and the engine core never sees an exception.

    Attributes:
        block_size: Tokens per paged KV block.
        check: Why the hand-over of a binding cannot be used (None when it can); None trusts
            every request (the in-process backend puts the KV there before submitting).
    """

    block_size: int
    check: Callable[[HandoffBinding], str | None] | None = None
    _pending: dict[str, _PendingLoad] = field(default_factory=dict)

    def num_new_matched_tokens(
        self,
        params: object,
        prompt_token_ids: Sequence[int] | None,
        num_prompt_tokens: int,
        num_computed_tokens: int,
    ) -> int:
        """Tokens the connector supplies beyond vLLM's own ``num_computed_tokens`` (no side effect).

        Args:
            params: The request's ``kv_transfer_params``.
            prompt_token_ids: The request's prompt (None for prompt embeddings: never fed).
            num_prompt_tokens: The request's prompt length.
            num_computed_tokens: Leading tokens vLLM already holds (its prefix-cache hit).
        """
        binding = self._usable(params, prompt_token_ids, num_prompt_tokens)
        if binding is None:
            return 0
        return max(0, binding.num_tokens - num_computed_tokens)

    def _usable(
        self, params: object, prompt_token_ids: Sequence[int] | None, num_prompt_tokens: int
    ) -> HandoffBinding | None:
        """The request's hand-over when the connector can supply it, else None.

        The reason is logged; vLLM then computes the whole prompt itself.
        """
        handoff, problem = read_params(params)
        if problem is not None:
            logger.warning("malformed adarag kv_transfer_params (%s); vLLM computes it", problem)
        if handoff is None:
            return None
        if not 0 < handoff.num_context_tokens < num_prompt_tokens or prompt_token_ids is None:
            logger.warning(
                "handoff %s covers %d of %d prompt tokens (vLLM must compute at least the last "
                "one); vLLM computes the prompt",
                handoff.handoff_id,
                handoff.num_context_tokens,
                num_prompt_tokens,
            )
            return None
        binding = HandoffBinding.of(handoff, prompt_token_ids)
        reason = None if self.check is None else self.check(binding)
        if reason is not None:
            logger.warning("%s; vLLM computes the prompt", reason)
            return None
        return binding

    def on_allocated(
        self,
        request_id: str,
        params: object,
        prompt_token_ids: Sequence[int] | None,
        num_external_tokens: int,
    ) -> None:
        """Remember a load once vLLM allocated blocks for ``num_external_tokens`` tokens."""
        handoff = HandoffRequest.from_params(params)
        if handoff is None or num_external_tokens == 0 or prompt_token_ids is None:
            self._pending.pop(request_id, None)
            return
        binding = HandoffBinding.of(handoff, prompt_token_ids)
        self._pending[request_id] = _PendingLoad(binding, num_external_tokens)

    def forget(self, request_id: str) -> None:
        """Drop a finished request's pending load, if any."""
        self._pending.pop(request_id, None)

    def take_loads(self, scheduler_output: Any) -> list[KVLoad]:
        """The loads of requests scheduled this step; clears them from the pending set.

        Args:
            scheduler_output: vLLM's ``SchedulerOutput``: new requests carry their block ids
                and computed-token count (vLLM's hit plus the connector's); a request resumed
                after preemption is rescheduled with all its block ids.
        """
        loads = []
        for new in scheduler_output.scheduled_new_reqs:
            load = self._pop_load(new.req_id, new.block_ids, new.num_computed_tokens)
            if load is not None:
                loads.append(load)
        cached = scheduler_output.scheduled_cached_reqs
        for idx, request_id in enumerate(cached.req_ids):
            block_ids = cached.new_block_ids[idx]
            if request_id not in cached.resumed_req_ids or block_ids is None:
                continue
            load = self._pop_load(request_id, block_ids, cached.num_computed_tokens[idx])
            if load is not None:
                loads.append(load)
        return loads

    def _pop_load(
        self, request_id: str, block_ids: tuple[list[int], ...], num_computed_tokens: int
    ) -> KVLoad | None:
        pending = self._pending.pop(request_id, None)
        if pending is None:
            return None
        end = num_computed_tokens
        start = end - pending.num_external_tokens
        assert len(block_ids) == 1, f"one KV cache group expected, got {len(block_ids)}"
        return KVLoad(
            request_id=request_id,
            binding=pending.binding,
            start=start,
            end=end,
            slot_mapping=slot_mapping(block_ids[0], start, end, self.block_size),
        )


def slot_mapping(block_ids: list[int], start: int, end: int, block_size: int) -> tuple[int, ...]:
    """Paged-cache slot of each position ``start..end-1`` of a request holding ``block_ids``."""
    assert end <= len(block_ids) * block_size, (
        f"positions up to {end} need {-(-end // block_size)} blocks, have {len(block_ids)}"
    )
    return tuple(
        block_ids[position // block_size] * block_size + position % block_size
        for position in range(start, end)
    )
