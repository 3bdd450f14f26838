"""``adarag serve`` over a tiny knowledge base in a process of its own, as the command runs it
(uvicorn in the main thread, handling SIGTERM): ``python -m tests.reliability.kb_server_process
CHECKPOINT ROOT SETTINGS_JSON`` prints ``port N`` once it listens."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

from adarag.config import ServeConfig
from adarag.serve import AdaRagServer, create_app
from tests.reliability.kb_server import kb_rag


def _report_port(server: AdaRagServer) -> None:
    while not server.started:
        time.sleep(0.02)
    sys.stdout.write(f"port {server.bound_port}\n")
    sys.stdout.flush()


def main(checkpoint: str, root: str, settings: str) -> None:
    options = json.loads(settings)
    rag, kb = kb_rag(Path(checkpoint), Path(root), **options.get("retrieval", {}))
    config = ServeConfig(port=0, documents_directory=Path(root) / "documents", **options["serve"])
    with kb:
        server = AdaRagServer(create_app(rag, config), config, log_level="warning")
        threading.Thread(target=_report_port, args=(server,), daemon=True).start()
        server.run()


if __name__ == "__main__":
    main(*sys.argv[1:4])
