"""``adarag serve``: an OpenAI-compatible HTTP server sharing one engine and one KV cache.

Needs the ``serve`` extra (FastAPI, uvicorn); nothing in the core imports this package.
"""

from __future__ import annotations

from adarag.errors import MissingDependencyError

try:
    import fastapi  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as err:
    raise MissingDependencyError("fastapi and uvicorn", "serve") from err

from adarag.serve.app import create_app  # noqa: E402
from adarag.serve.server import AdaRagServer  # noqa: E402

__all__ = ["AdaRagServer", "create_app"]
