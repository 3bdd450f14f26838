"""A process for the crash tests to kill: warms chunks, answers questions, or ingests files.

``python -m tests.reliability.crash_child MODE CONFIG_JSON [ARG]``; it prints one line per unit
of work done (``warmed i``, ``answered i``) so the test can pick a moment to ``kill -9`` it.
``ingest`` runs the real command line (``adarag --config CONFIG_JSON ingest ARG``).
"""

from __future__ import annotations

import os
import sys
import time

from adarag import AdaRAG, AdaRagConfig
from adarag.cli import main as cli_main
from adarag.schema import GenerationParams


def passages(count: int) -> list[str]:
    """Distinct passages of a few dozen tokens."""
    return [
        f"passage {idx}: the river number {idx} flows past town {idx * 7 % 13} in the "
        f"valley of {['ash', 'oak', 'elm', 'fir'][idx % 4]} trees, {idx} leagues from the sea."
        for idx in range(count)
    ]


def questions(count: int) -> list[tuple[str, list[str]]]:
    """Questions with rotating three-passage contexts (every answer writes KV back)."""
    texts = passages(count + 2)
    return [(f"where does river {idx} flow?", texts[idx : idx + 3]) for idx in range(count)]


def slow_disk(seconds: float) -> None:
    """Hold each staged entry for ``seconds`` before it is synced and renamed (a slow disk).

    A small entry is otherwise staged for well under a millisecond, and a loaded machine may
    finish the whole run before the test sees a staging file to kill the process in.
    """
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        time.sleep(seconds)
        real_fsync(fd)

    os.fsync = fsync


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(mode: str, config_path: str, arg: str | None) -> int:
    if mode == "ingest":
        return cli_main(["--config", config_path, "ingest", str(arg)])
    slow_disk(0.02)
    rag = AdaRAG(AdaRagConfig.from_file(config_path))
    count = int(arg or 20)
    if mode == "warm":
        for idx, text in enumerate(passages(count)):
            rag.warm([text])
            _say(f"warmed {idx + 1}")
    elif mode == "query":
        params = GenerationParams(max_new_tokens=3)
        for idx, (question, chunks) in enumerate(questions(count)):
            rag.query(question, chunks=chunks, params=params)
            _say(f"answered {idx + 1}")
    rag.close()
    _say("done")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None))
