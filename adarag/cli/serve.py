"""``adarag serve``: the OpenAI-compatible HTTP server over the knowledge base."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import sys
from typing import Any

from adarag.cli.options import (
    add_knowledge_base_arguments,
    add_model_arguments,
    build_config,
    external_splitter,
    non_negative_int,
    open_knowledge_base,
    positive_int,
)
from adarag.config import ServeConfig
from adarag.errors import ConfigError
from adarag.pipeline import AdaRAG

HELP = (
    "serve the knowledge base over an OpenAI-compatible HTTP API (chat and text completions "
    "with streaming, /v1/rag/query); many apps share one model and one KV cache"
)

# option -> ServeConfig field
_SERVE_OPTIONS = {
    "host": "host",
    "port": "port",
    "max_active": "max_active_requests",
    "max_queued": "max_queued_requests",
    "timeout": "request_timeout_s",
    "shutdown_grace": "shutdown_grace_s",
    "model_name": "model_name",
    "history_turns": "history_turns",
    "max_body_bytes": "max_request_body_bytes",
    "body_timeout": "body_read_timeout_s",
}


def _default(field: str) -> str:
    """``(default: X)`` of a ServeConfig field, for the help text."""
    return f"(default: {ServeConfig.model_fields[field].default})"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the command's options."""
    _add_server_arguments(parser)
    _add_backend_arguments(parser)
    add_knowledge_base_arguments(parser)
    add_model_arguments(parser)


def _add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """The HTTP server's limits (``serve.*``)."""
    parser.add_argument("--host", help=f"interface to listen on {_default('host')}")
    parser.add_argument(
        "--port", type=non_negative_int, help=f"TCP port; 0 picks a free one {_default('port')}"
    )
    parser.add_argument(
        "--max-active",
        type=positive_int,
        help=f"requests the engine works on at once {_default('max_active_requests')}",
    )
    parser.add_argument(
        "--max-queued",
        type=non_negative_int,
        help="requests that may wait for the engine; more get 429 "
        f"{_default('max_queued_requests')}",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        help=f"seconds a request may take, queue included {_default('request_timeout_s')}",
    )
    parser.add_argument(
        "--shutdown-grace",
        type=float,
        help="seconds in-flight requests get to finish on SIGTERM/SIGINT "
        f"{_default('shutdown_grace_s')}",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=positive_int,
        help="largest request body; larger ones get 413 before they are read "
        f"{_default('max_request_body_bytes')}",
    )
    parser.add_argument(
        "--body-timeout",
        type=float,
        help="seconds a request body may take to arrive; slower ones get 408 "
        f"{_default('body_read_timeout_s')}",
    )
    parser.add_argument(
        "--api-key",
        help="the key clients must send as 'Authorization: Bearer KEY' (default: "
        f"${ServeConfig.model_fields['api_key_env'].default}, which keeps it out of `ps`; "
        "neither: no key is required)",
    )
    parser.add_argument(
        "--allowed-origin",
        action="append",
        metavar="URL",
        help="a web origin (scheme://host[:port]) whose pages may call the server besides its "
        "own chat page (repeat for more; serve.allowed_origins)",
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        metavar="NAME",
        help="a host name clients reach the server by, besides the address it listens on "
        "(repeat for more; serve.allowed_hosts)",
    )
    parser.add_argument("--model-name", help="model id to list (default: the checkpoint name)")
    parser.add_argument(
        "--history-turns",
        type=non_negative_int,
        help=f"earlier chat turns carried {_default('history_turns')}",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="uvicorn's log level (info logs each request)",
    )


def _add_backend_arguments(parser: argparse.ArgumentParser) -> None:
    """Where and how answers are decoded."""
    parser.add_argument(
        "--batch-decode",
        action="store_true",
        help="decode concurrent requests together in one batch (engine.batch_decode): more "
        "tokens/s with several clients; answers can differ from a lone request's in float32 ties",
    )
    parser.add_argument(
        "--vllm-url",
        action="append",
        metavar="URL",
        help="decode on this `vllm serve` replica running adarag's connector (repeat for more "
        "replicas; engine.backend='vllm-server'): adarag fuses the prompt's KV, vLLM decodes",
    )
    parser.add_argument(
        "--vllm-handoff",
        metavar="DIR_OR_URL",
        help="where the replicas' connector reads fused KV (its handoff): a shared directory or "
        "a redis:// URL (default: engine.vllm_handoff)",
    )


def run(args: argparse.Namespace) -> int:
    """Open the knowledge base, load the model and serve until SIGTERM or SIGINT."""
    serve: dict[str, Any] = {
        field: getattr(args, option)
        for option, field in _SERVE_OPTIONS.items()
        if getattr(args, option) is not None
    }
    if args.allowed_origin:
        serve["allowed_origins"] = tuple(args.allowed_origin)
    if args.allowed_host:
        serve["allowed_hosts"] = tuple(args.allowed_host)
    flags = {
        f"serve.{field}": "--" + option.replace("_", "-")
        for option, field in _SERVE_OPTIONS.items()
    }
    flags.update(
        {"serve.allowed_origins": "--allowed-origin", "serve.allowed_hosts": "--allowed-host"}
    )
    engine: dict[str, Any] = {"batch_decode": True} if args.batch_decode else {}
    if args.vllm_url:
        engine.update(backend="vllm-server", vllm_server_urls=tuple(args.vllm_url))
    if args.vllm_handoff:
        engine["vllm_handoff"] = args.vllm_handoff
    config = build_config(args, flags, serve=serve, engine=engine)
    api_key, key_source = api_key_of(args, config.serve)
    from adarag.serve import AdaRagServer, create_app

    logging.getLogger("adarag").setLevel(logging.INFO)
    # it cuts documents sent; an empty one is filled over HTTP (/v1/files, the chat page)
    with open_knowledge_base(config, external_splitter(args), allow_empty=True) as kb:
        rag = AdaRAG(config, retriever=kb)
        app = create_app(rag, config.serve, api_key=api_key)
        server = AdaRagServer(app, config.serve, log_level=args.log_level)
        key = f"API key from {key_source}" if api_key else "no API key"
        warning = exposure_warning(config.serve.host, api_key, config.serve.api_key_env)
        if warning:
            print(f"warning: {warning}", file=sys.stderr, flush=True)
        print(
            f"serving {kb.count()} chunks of {config.retrieval.collection!r} as "
            f"{app.state.service.model_id!r} ({key}); SIGTERM or Ctrl-C stops",
            flush=True,
        )
        server.run()
    return 0


def api_key_of(args: argparse.Namespace, config: ServeConfig) -> tuple[str | None, str]:
    """The API key (``--api-key``, else the environment variable) and where it came from.

    Raises:
        ConfigError: ``--api-key`` is empty or blank.
    """
    if args.api_key is not None:
        if not args.api_key.strip():
            raise ConfigError(
                "--api-key is empty; give a key (e.g. `openssl rand -hex 32`), or leave the "
                "option out to serve without one"
            )
        return args.api_key, "--api-key"
    return os.environ.get(config.api_key_env) or None, f"${config.api_key_env}"


def exposure_warning(
    host: str, api_key: str | None, api_key_env: str = "ADARAG_API_KEY"
) -> str | None:
    """What to warn of when serving without a key on an address others can reach; else None."""
    if api_key:
        return None
    name = host.strip("[]").lower()
    try:
        if name == "localhost" or ipaddress.ip_address(name).is_loopback:
            return None
    except ValueError:
        pass  # a host name: it may resolve to any address
    return (
        f"serving on {host} without an API key: anyone who can reach this address can query "
        f"the knowledge base and add or delete its documents; set --api-key or ${api_key_env}, "
        "or listen on 127.0.0.1"
    )
