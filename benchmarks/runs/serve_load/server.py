"""``adarag serve`` in a process of its own, over a knowledge base ``adarag ingest`` built."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from adarag import AdaRagConfig

ADARAG = str(Path(sys.executable).parent / "adarag")


def ingest(root: Path, config: AdaRagConfig, corpus: Path) -> Path:
    """``root/config.json`` of ``config``, with ``corpus`` ingested (chunk KV precomputed)."""
    path = root / "config.json"
    path.write_text(json.dumps(config.model_dump(mode="json")))
    subprocess.run([ADARAG, "--config", str(path), "ingest", str(corpus)], check=True)
    return path


class Server:
    """``adarag serve`` in a process of its own on a free loopback port."""

    def __init__(self, config_path: Path, options: list[str]) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}/v1"
        started = time.perf_counter()
        command = [ADARAG, "--config", str(config_path), "serve", "--port", str(port)]
        self.process = subprocess.Popen(
            [*command, "--log-level", "warning", *options],
            env={**os.environ, "ADARAG_API_KEY": ""},
        )
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if self.process.poll() is not None:
                raise SystemExit("adarag serve exited before it listened")
            time.sleep(0.2)
        self.startup_s = time.perf_counter() - started

    def stop(self) -> float:
        """SIGTERM, then the seconds until the process exited (cache flushed)."""
        started = time.perf_counter()
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=300)
        return time.perf_counter() - started

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.process.poll() is None:
            self.stop()
