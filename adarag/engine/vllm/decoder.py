"""vLLM as the decoder: adarag fuses the context KV, vLLM decodes, samples and streams.

The engine runs adarag's fusion loop over the layers of the model vLLM loaded (through
:class:`~adarag.engine.vllm.adapter.VLLMDecoderAdapter`, no second copy of the weights), so the
pipeline gets logits and logit-lens signals as from the torch engine. :class:`VLLMDecoder` hands
the fused KV to vLLM, which computes the last prompt token and decodes.

Prefix caching: a connector-fed request carries a cache salt of its own, so vLLM hashes the
blocks holding fused (approximate) KV apart from every other prompt's: a plain request with the
same tokens never reuses them, and a fused request never reuses blocks computed for another.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Generator, Sequence
from typing import Any

import torch
from vllm import SamplingParams
from vllm.sampling_params import RequestOutputKind
from vllm.v1.worker.worker_base import WorkerBase

from adarag.config import EngineConfig
from adarag.engine.checkpoint import Checkpoint
from adarag.engine.vllm.adapter import VLLMDecoderAdapter
from adarag.engine.vllm.connector import AdaRagConnector
from adarag.engine.vllm.engine import EngineDriver, RequestProgress, build_engine
from adarag.engine.vllm.fused_decoder import FusedKVDecoder, TokenStream
from adarag.engine.vllm.handoff import FusedContext, HandoffRequest, KVHandoff
from adarag.errors import ConfigError
from adarag.schema import GenerationParams

logger = logging.getLogger(__name__)


class VLLMTokenStream(TokenStream):
    """Generated token ids of one in-process vLLM request, and what was reported about its prompt.

    The request is submitted at the first ``next()`` and each ``next()`` steps the engine until
    a token is ready; closing the stream (or dropping it) aborts an unfinished request and
    releases its fused KV.
    """

    def __init__(self, tokens: Generator[int, None, None], progress: RequestProgress) -> None:
        super().__init__(tokens, progress)
        self._progress = progress

    @property
    def num_connector_tokens(self) -> int:
        """Prompt tokens whose KV adarag's connector wrote into vLLM's cache."""
        return self._progress.num_connector_tokens


def start_vllm(
    checkpoint: Checkpoint,
    engine_config: EngineConfig,
    max_context_tokens: int,
    eos_token_ids: frozenset[int],
) -> tuple[VLLMDecoderAdapter, VLLMDecoder]:
    """Start an in-process vLLM engine on ``checkpoint``: its model's layers and its decoder.

    vLLM runs in this process (its worker-side connector and model must be reachable), so its
    CPU worker's process-wide settings apply here too: it binds memory to the NUMA node and
    replaces ``torch.set_num_threads`` with a no-op (``engine.num_threads`` is applied before).

    Raises:
        ModelLoadError: vLLM loaded a model class the adapter does not know.
        ConfigError: ``engine.device`` is not where vLLM placed the model.
    """
    started = time.perf_counter()
    engine = build_engine(checkpoint.path, engine_config, max_context_tokens)
    startup_s = time.perf_counter() - started
    driver = EngineDriver(engine)
    handoff = KVHandoff()
    try:
        engine.collective_rpc(functools.partial(_bind_handoff, handoff=handoff))
        model = VLLMDecoderAdapter(engine.apply_model(_the_model)[0], checkpoint.spec)
        if model.device != torch.device(engine_config.device):
            raise ConfigError(
                f"vLLM placed the model on {model.device}, but engine.device is "
                f"{engine_config.device!r}; set engine.device to {str(model.device)!r}"
            )
    except BaseException:
        driver.shutdown()
        raise
    logger.info("vLLM engine for %s started in %.1f s", checkpoint.name, startup_s)
    return model, VLLMDecoder(driver, handoff, eos_token_ids, startup_s)


class VLLMDecoder(FusedKVDecoder):
    """Decoding by an in-process vLLM engine fed adarag's fused KV (``engine.backend == "vllm"``).

    :meth:`decode_tokens` hands the fused KV of every prompt token but the last to vLLM's worker
    through adarag's connector and submits the prompt; vLLM treats those tokens as computed,
    computes the last one, then decodes and samples with its own scheduler, paged memory and
    batching.

    Args:
        driver: Steps the engine for whichever request waits.
        handoff: Where fused KV waits for the connector.
        eos_token_ids: Tokens that end an answer.
        startup_s: Seconds vLLM took to start.
    """

    def __init__(
        self,
        driver: EngineDriver,
        handoff: KVHandoff,
        eos_token_ids: frozenset[int],
        startup_s: float,
    ) -> None:
        self.driver = driver
        self.handoff = handoff
        self.eos_token_ids = eos_token_ids
        self.startup_s = startup_s

    def _decode_fused(
        self,
        token_ids: Sequence[int],
        params: GenerationParams,
        handoff: HandoffRequest,
        context: FusedContext,
    ) -> VLLMTokenStream:
        sampling = self._sampling(params, handoff.to_params())
        return self._stream(token_ids, sampling, handoff.handoff_id, (handoff, context))

    def _generate(
        self, token_ids: Sequence[int], params: GenerationParams, cache_salt: str | None
    ) -> VLLMTokenStream:
        return self._stream(token_ids, self._sampling(params, None), cache_salt, None)

    def close(self) -> None:
        """Shut vLLM down; the engine is unusable afterwards."""
        self.driver.shutdown()

    def _sampling(
        self, params: GenerationParams, kv_transfer_params: dict[str, Any] | None
    ) -> SamplingParams:
        return SamplingParams(
            max_tokens=params.max_new_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            seed=params.seed,
            stop_token_ids=sorted(self.eos_token_ids),
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
            extra_args=None
            if kv_transfer_params is None
            else {"kv_transfer_params": kv_transfer_params},
        )

    def _stream(
        self,
        token_ids: Sequence[int],
        sampling: SamplingParams,
        cache_salt: str | None,
        fused: tuple[HandoffRequest, FusedContext] | None,
    ) -> VLLMTokenStream:
        progress = RequestProgress()
        tokens = self._tokens(list(token_ids), sampling, cache_salt, fused, progress)
        return VLLMTokenStream(tokens, progress)

    def _tokens(
        self,
        token_ids: list[int],
        sampling: SamplingParams,
        cache_salt: str | None,
        fused: tuple[HandoffRequest, FusedContext] | None,
        progress: RequestProgress,
    ) -> Generator[int, None, None]:
        """Submit, then yield tokens as vLLM produces them; always release what was taken."""
        request_id = None
        if fused is not None:
            self.handoff.put(fused[0].handoff_id, fused[1])
        try:
            request_id = self.driver.submit(token_ids, sampling, progress, cache_salt)
            while True:
                self.driver.wait(request_id)
                if fused is not None:
                    progress.num_connector_tokens = self.handoff.num_written(fused[0].handoff_id)
                while progress.tokens:
                    token = progress.tokens.popleft()
                    if token in self.eos_token_ids:
                        return
                    yield token
                if progress.finished:
                    return
        finally:
            if request_id is not None:
                self.driver.release(request_id)
            if fused is not None:
                self.handoff.drop(fused[0].handoff_id)


def _bind_handoff(worker: WorkerBase, handoff: KVHandoff) -> None:
    """Runs in vLLM's worker: attach the engine's handoff to the worker-side connector."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    connector = get_kv_transfer_group()
    assert isinstance(connector, AdaRagConnector), f"vLLM runs {type(connector).__name__}"
    connector.bind_handoff(handoff)


def _the_model(model: torch.nn.Module) -> torch.nn.Module:
    """Runs in vLLM's worker (``apply_model``): hands back the model it loaded."""
    return model
