"""Decoding on ``vllm serve`` replicas: adarag fuses the context KV, a vLLM server decodes.

``engine.backend = "vllm-server"`` is a prefill/decode split. adarag's torch engine does what
it does for every request (retrieval, arrangement, chunk-KV lookup in its store tiers, the fused
prefill) and samples the first token from the prefill's logits, which is streamed at once.
:class:`VLLMServerDecoder` then hands the fused KV of the whole prompt over (a shared directory
or a Redis-protocol server, :mod:`~adarag.engine.vllm.handoff_store`) and sends the prompt's
token ids and the first token to a replica's OpenAI ``/v1/completions`` route with
``kv_transfer_params`` naming the handoff. adarag's connector in the replica's worker processes
writes those rows into vLLM's paged blocks; vLLM computes the first token's KV, then decodes,
samples and batches with every other request it serves.

No vLLM import: the front end runs on a machine (or in an environment) without vLLM.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import torch
from safetensors import SafetensorError

from adarag.config import EngineConfig
from adarag.engine.adapter import DecoderAdapter
from adarag.engine.checkpoint import Checkpoint
from adarag.engine.loader import load_model
from adarag.engine.vllm.fused_decoder import FusedKVDecoder, TokenStream
from adarag.engine.vllm.handoff import FusedContext, HandoffBinding, HandoffRequest
from adarag.engine.vllm.handoff_files import as_storage
from adarag.engine.vllm.handoff_store import HandoffStore, open_front_end_handoff
from adarag.engine.vllm.handoff_sweep import HandoffSweeper
from adarag.errors import BackendError, ConfigError
from adarag.schema import GenerationParams

logger = logging.getLogger(__name__)


@dataclass
class Replica:
    """One ``vllm serve`` replica and the requests it is answering for this front end.

    Attributes:
        url: Base URL, e.g. ``http://127.0.0.1:8000``.
        model: The model name it serves (its ``/v1/models`` id).
        in_flight: Streams open on it now.
    """

    url: str
    model: str
    in_flight: int = 0


@dataclass
class ServerReport:
    """What a replica reported about a request's prompt (its last event's usage).

    Attributes:
        num_cached_tokens: Prompt tokens the replica did not compute, its prefix-cache hit plus
            the connector's tokens; None until the stream ended, or when the replica does not
            report it (start it with ``--enable-prompt-tokens-details``).
    """

    num_cached_tokens: int | None = None


class VLLMServerDecoder(FusedKVDecoder):
    """Decodes on ``vllm serve`` replicas fed adarag's fused KV (``engine.backend="vllm-server"``).

    Args:
        replicas: The replicas; each request goes to the one with the fewest open streams.
        handoff: Where every replica's connector reads fused KV (a directory or a server).
        eos_token_ids: Tokens that end an answer.
        kv_dtype: Dtype the fused KV is written in (that of the replicas' KV cache).
        timeout_s: Seconds to wait for a replica's next bytes before giving up.
        sweeper: Deletes hand-overs left behind, until :meth:`close`.
        api_key: The key the replicas require (``vllm serve --api-key``); None: none.
    """

    remote = True
    """Tokens come from another process: decoding needs no engine lock (``pipeline.decode``)."""

    first_token_from_prefill = True

    def __init__(
        self,
        replicas: Sequence[Replica],
        handoff: HandoffStore,
        eos_token_ids: frozenset[int],
        kv_dtype: torch.dtype,
        timeout_s: float,
        sweeper: HandoffSweeper | None = None,
        api_key: str | None = None,
    ) -> None:
        assert replicas, "at least one replica"
        self.replicas = list(replicas)
        self.handoff = handoff
        self.sweeper = sweeper
        self.eos_token_ids = eos_token_ids
        self.kv_dtype = kv_dtype
        self._client = httpx.Client(
            timeout=httpx.Timeout(timeout_s, connect=10.0), headers=_auth_headers(api_key)
        )
        self._lock = threading.Lock()
        self._order = itertools.count()

    def _decode_fused(
        self,
        token_ids: Sequence[int],
        params: GenerationParams,
        handoff: HandoffRequest,
        context: FusedContext,
    ) -> TokenStream:
        binding = HandoffBinding.of(handoff, token_ids)
        try:
            self.handoff.write(binding, as_storage(context, self.kv_dtype))
        except (OSError, SafetensorError) as err:  # e.g. a full tmpfs: the replica computes it
            logger.warning(
                "cannot hand fused KV over through %s (%s); vLLM computes the prompt",
                self.handoff.location,
                err,
            )
            return self.generate(token_ids, params)
        extra = {"kv_transfer_params": handoff.to_params(), "cache_salt": handoff.handoff_id}
        return self._stream(token_ids, params, extra, handoff.handoff_id)

    def _generate(
        self, token_ids: Sequence[int], params: GenerationParams, cache_salt: str | None
    ) -> TokenStream:
        extra = {} if cache_salt is None else {"cache_salt": cache_salt}
        return self._stream(token_ids, params, extra, None)

    def close(self) -> None:
        """Close the HTTP connections and stop sweeping."""
        self._client.close()
        if self.sweeper is not None:
            self.sweeper.stop()

    def _stream(
        self,
        token_ids: Sequence[int],
        params: GenerationParams,
        extra: dict[str, Any],
        handoff_id: str | None,
    ) -> TokenStream:
        report = ServerReport()
        body = {**self._body(token_ids, params), **extra}
        return TokenStream(self._tokens(body, handoff_id, report), report)

    def _body(self, token_ids: Sequence[int], params: GenerationParams) -> dict[str, Any]:
        return {
            "prompt": list(token_ids),
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "seed": params.seed,
            "stop_token_ids": sorted(self.eos_token_ids),
            "skip_special_tokens": False,
            "return_token_ids": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }

    def _pick(self) -> Replica:
        with self._lock:
            turn = next(self._order)  # ties go round-robin
            count = len(self.replicas)
            replica = min(
                (self.replicas[(turn + i) % count] for i in range(count)),
                key=lambda r: r.in_flight,
            )
            replica.in_flight += 1
            return replica

    def _done(self, replica: Replica) -> None:
        with self._lock:
            replica.in_flight -= 1

    def _tokens(
        self, body: dict[str, Any], handoff_id: str | None, report: ServerReport
    ) -> Generator[int, None, None]:
        """POST, then yield tokens as the replica streams them; always clean up what was taken."""
        replica = self._pick()
        body["model"] = replica.model
        try:
            with self._client.stream("POST", f"{replica.url}/v1/completions", json=body) as reply:
                if reply.status_code != 200:
                    reply.read()
                    raise BackendError(
                        f"vLLM server {replica.url} answered {reply.status_code}: "
                        f"{reply.text[:500]}"
                    )
                ended = False  # at EOS; read on to the usage the server sends last
                for event in _events(reply.iter_lines()):
                    _record_usage(event, report)
                    for choice in () if ended else event.get("choices") or ():
                        for token in choice.get("token_ids") or ():
                            if token in self.eos_token_ids:
                                ended = True
                                break
                            yield int(token)
        except httpx.HTTPError as err:
            raise BackendError(
                f"vLLM server {replica.url} failed: {err!r}; check that `vllm serve` runs there "
                "with adarag's connector (docs/scaling.md)"
            ) from err
        finally:
            self._done(replica)
            if handoff_id is not None:
                self.handoff.remove(handoff_id)


def _events(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """The JSON events of a server-sent event stream, up to ``[DONE]``."""
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            return
        event = json.loads(data)
        if "error" in event:
            raise BackendError(f"vLLM server error: {event['error']}")
        yield event


def _record_usage(event: dict[str, Any], report: ServerReport) -> None:
    usage = event.get("usage")
    if usage:
        report.num_cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")


def start_vllm_server(
    checkpoint: Checkpoint,
    engine_config: EngineConfig,
    max_context_tokens: int,
    eos_token_ids: frozenset[int],
) -> tuple[DecoderAdapter, VLLMServerDecoder]:
    """The torch model for adarag's fused prefill, and a decoder on the configured replicas.

    Raises:
        BackendError: A replica does not answer ``GET /v1/models``.
        ConfigError: A replica accepts shorter prompts than ``max_context_tokens``, or the
            hand-over has no key or is not private.
    """
    handoff = open_front_end_handoff(engine_config)
    secret = engine_config.vllm_server_api_key
    api_key = None if secret is None else secret.get_secret_value()
    replicas = [
        _replica(url, max_context_tokens, engine_config.vllm_server_timeout_s, api_key)
        for url in engine_config.vllm_server_urls
    ]
    dtype = getattr(torch, engine_config.dtype)
    model = load_model(checkpoint.path, checkpoint.spec, dtype, engine_config.device)
    sweeper = HandoffSweeper(handoff, engine_config.vllm_server_timeout_s).start()
    decoder = VLLMServerDecoder(
        replicas,
        handoff,
        eos_token_ids,
        dtype,
        engine_config.vllm_server_timeout_s,
        sweeper,
        api_key,
    )
    return model, decoder


def _auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _replica(url: str, max_context_tokens: int, timeout_s: float, api_key: str | None) -> Replica:
    """Ask the replica at ``url`` what it serves.

    Raises:
        BackendError: It does not answer, or refuses the API key.
        ConfigError: It accepts shorter prompts than ``max_context_tokens``.
    """
    url = url.rstrip("/")
    try:
        reply = httpx.get(
            f"{url}/v1/models", timeout=min(timeout_s, 30.0), headers=_auth_headers(api_key)
        )
        if reply.status_code == 401:
            raise BackendError(
                f"the vLLM server at {url} refused {'the' if api_key else 'a request without an'} "
                "API key (401); set $VLLM_API_KEY (engine.vllm_server_api_key) to the key its "
                "`vllm serve --api-key` (or $VLLM_API_KEY) requires"
            )
        reply.raise_for_status()
        (served, *_) = reply.json()["data"]
    except (httpx.HTTPError, KeyError, ValueError) as err:
        raise BackendError(
            f"no vLLM server answers at {url} ({err!r}); start `vllm serve` there with adarag's "
            "connector (docs/scaling.md) or fix engine.vllm_server_urls"
        ) from err
    max_model_len = served.get("max_model_len")
    if max_model_len is not None and max_model_len < max_context_tokens:
        raise ConfigError(
            f"the vLLM server at {url} accepts {max_model_len} tokens of prompt plus answer, "
            f"adarag {max_context_tokens}; set engine.max_context_tokens to at most "
            f"{max_model_len} or restart vllm serve with --max-model-len {max_context_tokens}"
        )
    return Replica(url, str(served["id"]))
