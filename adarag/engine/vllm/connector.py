"""adarag's out-of-tree vLLM KV connector: hands a prompt's fused KV to vLLM as computed tokens.

vLLM builds two instances of the class named in ``KVTransferConfig(kv_connector="AdaRagConnector",
kv_connector_module_path="adarag.engine.vllm.connector", kv_role="kv_both")``:

- the **scheduler** one answers :meth:`get_num_new_matched_tokens` from the request's
  ``kv_transfer_params`` (all prompt tokens before the last), records the load once vLLM allocated
  blocks, and turns it into slot mappings in :meth:`build_connector_meta`
  (:class:`~adarag.engine.vllm.scheduling.ConnectorScheduler`);
- the **worker** one writes the fused rows into every layer's paged blocks in
  :meth:`start_load_kv`, before vLLM's forward of the last prompt token (under ``vllm serve``,
  the first answer token, which the front end already streamed). It takes them from the
  engine's :class:`KVHandoff` when adarag runs vLLM in its own process (bound after
  start-up), or, under ``vllm serve``, from where an adarag front end handed it over: the
  directory or ``redis://`` server named by ``kv_connector_extra_config.handoff``
  (:mod:`~adarag.engine.vllm.handoff_store`), signed with the hand-over key both sides hold;
  each tensor-parallel rank verifies the hand-over and reads only its KV heads. Loads are
  synchronous; there is nothing to save.

A request whose ``kv_transfer_params`` are malformed, or whose fused KV is missing, signed under
another key, written for another request or prompt, or otherwise unusable, is computed by vLLM
itself, with the reason logged: the scheduler side claims no tokens for it (it checks the
hand-over's header), or (when the worker's full check fails, or the file vanished between the
two sides) the worker reports its blocks as failed, which vLLM recomputes under
``kv_load_failure_policy = "recompute"``. Under ``vllm serve`` the scheduler side also sweeps
hand-overs older than ``handoff_max_age_s`` (a killed front end's).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from adarag.engine.vllm.handoff import FusedContext, KVHandoff
from adarag.engine.vllm.handoff_store import open_replica_handoff
from adarag.engine.vllm.handoff_sweep import HandoffSweeper
from adarag.engine.vllm.kv_writer import attention_layers, write_rows
from adarag.engine.vllm.ranks import kv_heads_of_rank
from adarag.engine.vllm.scheduling import ConnectorScheduler, KVLoad

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

logger = logging.getLogger(__name__)


@dataclass
class AdaRagConnectorMetadata(KVConnectorMetadata):
    """What the scheduler side tells the worker side for one step: the loads to perform."""

    loads: list[KVLoad] = field(default_factory=list)


class AdaRagConnector(KVConnectorBase_V1):
    """Supplies adarag's fused context KV to vLLM (see the module docstring)."""

    _cache_hit_source = CacheHitSource.HOST  # fused KV waits in host memory

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self._block_size = vllm_config.cache_config.block_size
        transfer = vllm_config.kv_transfer_config
        handed = (
            None if transfer is None else open_replica_handoff(transfer.kv_connector_extra_config)
        )
        self._handed = None if handed is None else handed[0]
        self._scheduler = ConnectorScheduler(
            self._block_size, None if self._handed is None else self._handed.check
        )
        if handed is not None and role == KVConnectorRole.SCHEDULER:
            HandoffSweeper(*handed).start()  # a daemon thread, for the replica's lifetime
        self._handoff: KVHandoff | None = None
        self._total_kv_heads = vllm_config.model_config.get_total_num_kv_heads()
        self._failed_block_ids: set[int] = set()

    # --- worker side

    def bind_handoff(self, handoff: KVHandoff) -> None:
        """Attach the engine's handoff, where fused KV waits under its handoff id."""
        assert self.role == KVConnectorRole.WORKER, "only the worker side writes KV"
        self._handoff = handoff

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        """Write this step's fused rows into vLLM's paged cache (before the forward)."""
        metadata = self._get_connector_metadata()
        assert isinstance(metadata, AdaRagConnectorMetadata)
        if not metadata.loads:
            return
        layers = attention_layers(forward_context.no_compile_layers)
        layer = next(iter(layers.values()))
        device = layer.kv_cache.device
        shape = (len(layers), int(layer.num_kv_heads), int(layer.head_size))
        for load in metadata.loads:
            context = self._context(load, shape)
            if context is None:
                # vLLM recomputes the blocks it cannot load (kv_load_failure_policy="recompute").
                self._failed_block_ids.update(s // self._block_size for s in load.slot_mapping)
                continue
            slots = torch.tensor(load.slot_mapping, dtype=torch.int64, device=device)
            write_rows(layers, context, load.start, load.end, slots)
            if self._handoff is not None:
                self._handoff.record_written(load.handoff_id, load.end - load.start)

    def _context(self, load: KVLoad, shape: tuple[int, int, int]) -> FusedContext | None:
        """The fused KV of ``load``'s request (this rank's heads), or None with a warning.

        Args:
            load: The rows to write.
            shape: (layers, KV heads, head dim) of this rank's paged cache.
        """
        if self._handoff is not None:
            context = self._handoff.get(load.handoff_id)
        else:
            assert self._handed is not None, (
                "adarag's connector has no fused KV source: set kv_connector_extra_config."
                "handoff (vllm serve) or run vLLM through adarag's vllm backend"
            )
            context = self._handed.read(load.binding, self._rank_heads)
        if context is None:
            logger.warning("no fused KV for request %s; vLLM recomputes it", load.request_id)
        elif context.num_tokens < load.end:
            logger.warning(
                "fused KV of request %s has %d rows, %d needed; vLLM recomputes it",
                load.request_id,
                context.num_tokens,
                load.end,
            )
            return None
        elif (context.k.shape[0], context.k.shape[2], context.k.shape[3]) != shape:
            logger.warning(
                "fused KV of request %s has (layers, heads, dim) %s, this worker %s; vLLM "
                "recomputes it (was it computed for another model?)",
                load.request_id,
                tuple(context.k.shape[i] for i in (0, 2, 3)),
                shape,
            )
            return None
        return context

    @functools.cached_property
    def _rank_heads(self) -> range | None:
        """The KV heads this tensor-parallel rank holds (None: all of them, one rank)."""
        from vllm.distributed import (
            get_tensor_model_parallel_rank,
            get_tensor_model_parallel_world_size,
        )

        world_size = get_tensor_model_parallel_world_size()
        if world_size == 1:
            return None
        return kv_heads_of_rank(self._total_kv_heads, world_size, get_tensor_model_parallel_rank())

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Loads finish inside :meth:`start_load_kv`; nothing to wait for."""

    def save_kv_layer(
        self,
        layer_name: str,
        kv_layer: torch.Tensor,
        attn_metadata: AttentionMetadata,
        **kwargs: Any,
    ) -> None:
        """Nothing to save: adarag stores chunk KV from its own prefill."""

    def wait_for_save(self) -> None:
        """Nothing is saved."""

    def get_block_ids_with_load_errors(self) -> set[int]:
        """Blocks of requests whose fused KV was gone (reported once)."""
        failed, self._failed_block_ids = self._failed_block_ids, set()
        return failed

    # --- scheduler side

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        """Context tokens adarag supplies beyond vLLM's own hit; loaded synchronously."""
        num_tokens = self._scheduler.num_new_matched_tokens(
            request.kv_transfer_params,
            request.prompt_token_ids,
            request.num_prompt_tokens,
            num_computed_tokens,
        )
        return num_tokens, False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        """Remember the load of a request vLLM just allocated blocks for."""
        self._scheduler.on_allocated(
            request.request_id,
            request.kv_transfer_params,
            request.prompt_token_ids,
            num_external_tokens,
        )

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        """The loads of requests scheduled this step, as slot mappings."""
        return AdaRagConnectorMetadata(self._scheduler.take_loads(scheduler_output))

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        """Free the blocks now; nothing is sent anywhere."""
        self._scheduler.forget(request.request_id)
        return False, None
