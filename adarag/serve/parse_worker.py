"""Parsing a sent document in a worker process that is killed at its deadline.

A document sent to ``POST /v1/files`` is parsed before it is kept, and parsing can take far
longer than its size suggests (a Word file of 83 KB holding half a million empty paragraphs
pins a core for half an hour). :class:`DocumentParser` therefore runs
:func:`~adarag.retrievers.chunking.read_source_file` in a process of its own, started as a
script (so it imports only the readers, never the server or torch), and waits for it without
holding a thread. The process gets ``retrieval.max_parse_seconds`` of CPU time (``RLIMIT_CPU``)
and of wall-clock time; past either, when the request is cancelled (its client hung up) or
when the server shuts down, it is killed at once. What it read comes back as JSON on its
standard output (nothing is unpickled).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import signal
import sys
from pathlib import Path
from typing import Any

from adarag.config.retrieval import RetrievalConfig
from adarag.errors import InputError
from adarag.retrievers.chunking import read_source_file
from adarag.retrievers.sources import SourceDocument, SourceFile

logger = logging.getLogger(__name__)

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
"""The folder holding the ``adarag`` package, put first on the worker's path."""
_KILLED_FOR_TIME = (-signal.SIGXCPU, -signal.SIGKILL)


class ParseTimeoutError(InputError):
    """A document took longer than ``retrieval.max_parse_seconds`` to parse."""


class ParserClosedError(RuntimeError):
    """The server is shutting down and parses no more documents."""


class DocumentParser:
    """Parses documents in worker processes with a CPU and wall-clock deadline.

    Args:
        config: ``max_parse_seconds`` and the limits :func:`read_source_file` applies
            (``max_file_bytes``, ``max_line_chars``).
    """

    def __init__(self, config: RetrievalConfig) -> None:
        self.config = config
        self._running: set[asyncio.subprocess.Process] = set()
        self._closed = False

    async def read(self, path: Path) -> SourceFile:
        """Parse ``path`` in a worker process (as ``KnowledgeBase.read`` would, in this one).

        Raises:
            InputError: The document cannot be read (as :func:`read_source_file` says), or
                its parser failed.
            ParseTimeoutError: It took longer than ``max_parse_seconds``.
            ParserClosedError: The server is shutting down.
        """
        limit_s = self.config.max_parse_seconds
        process = await self._start(path, limit_s)
        try:
            async with asyncio.timeout(limit_s):
                output, errors = await process.communicate()
        except TimeoutError:
            raise ParseTimeoutError(_too_slow(path, limit_s)) from None
        finally:  # a timeout, a cancellation (the client hung up) or a shutdown: kill it now
            self._running.discard(process)
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await asyncio.shield(process.wait())
        return self._result(path, process.returncode, output, errors)

    def close(self) -> None:
        """Kill every running parse and refuse new ones (their requests fail with 503)."""
        self._closed = True
        for process in list(self._running):
            with contextlib.suppress(ProcessLookupError):
                process.kill()

    async def _start(self, path: Path, limit_s: float) -> asyncio.subprocess.Process:
        if self._closed:
            raise ParserClosedError("the server is shutting down")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(_python_path())}
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-P",  # the script's folder (adarag/serve) is not put on the path
            __file__,
            str(path),
            json.dumps([self.config.max_file_bytes, self.config.max_line_chars, limit_s]),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        self._running.add(process)
        if self._closed:  # closed while it started
            process.kill()
        return process

    def _result(self, path: Path, returncode: int | None, output: bytes, errors: bytes) -> Any:
        if self._closed:
            raise ParserClosedError("the server is shutting down")
        if returncode in _KILLED_FOR_TIME:
            raise ParseTimeoutError(_too_slow(path, self.config.max_parse_seconds))
        if returncode != 0:
            logger.warning(
                "the parser of %s ended with status %s: %s",
                path.name,
                returncode,
                errors.decode("utf-8", "replace")[-2000:],
            )
            raise InputError(
                f"{path.name} could not be parsed (its reader failed); check that it is a "
                "valid file of its type"
            )
        found = json.loads(output)
        if "error" in found:
            raise InputError(found["error"])
        return _source_file(found["source"])


def _too_slow(path: Path, limit_s: float) -> str:
    return (
        f"{path.name} took more than {limit_s:g} s to parse (retrieval.max_parse_seconds) and "
        "was refused; send a smaller or simpler document, or raise the limit"
    )


def _python_path() -> list[str]:
    given = os.environ.get("PYTHONPATH", "")
    return [_PACKAGE_ROOT, *(part for part in given.split(os.pathsep) if part)]


def _as_json(source: SourceFile) -> dict[str, Any]:
    return {
        "path": str(source.path),
        "sha256": source.sha256,
        "documents": [[doc.text, doc.key, doc.title, doc.metadata] for doc in source.documents],
        "has_headings": source.has_headings,
        "converted": source.converted,
        "empty_reason": source.empty_reason,
    }


def _source_file(found: dict[str, Any]) -> SourceFile:
    documents = tuple(
        SourceDocument(text, key, title, metadata)
        for text, key, title, metadata in found["documents"]
    )
    return SourceFile(
        Path(found["path"]),
        found["sha256"],
        documents,
        has_headings=found["has_headings"],
        converted=found["converted"],
        empty_reason=found.get("empty_reason"),
    )


def _parse(path: str, limits: str) -> dict[str, Any]:
    """The worker's work: read ``path`` under the limits, as a JSON-ready dict."""
    import resource

    max_file_bytes, max_line_chars, limit_s = json.loads(limits)
    cpu_s = max(1, math.ceil(limit_s))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))  # SIGXCPU, then SIGKILL
    try:
        source = read_source_file(
            Path(path), max_file_bytes=max_file_bytes, max_line_chars=max_line_chars
        )
    except InputError as err:
        return {"error": str(err)}
    return {"source": _as_json(source)}


if __name__ == "__main__":
    sys.stdout.write(json.dumps(_parse(sys.argv[1], sys.argv[2])))
