"""``adarag config``: the configuration a command would run with, its file, secrets masked."""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from adarag.cli.options import add_knowledge_base_arguments, add_model_arguments, build_config
from adarag.config import (
    CONFIG_ENV,
    SECRET_FIELDS,
    AdaRagConfig,
    default_config_file,
    find_config_file,
    redact_url,
)

HELP = "show the resolved configuration (its file, then every setting; secrets masked)"
PRECEDENCE = (
    "command-line options > --config FILE > ${env} > {default} > defaults (one file is read, "
    "the first that is named or exists)"
)
MASK = "***"
_SECRET_NAME = re.compile(r"(^|_)(api_key|password|secret|token|signing_key)$")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the command's options."""
    parser.add_argument(
        "--changed",
        action="store_true",
        help="show only the settings that differ from the defaults",
    )
    add_knowledge_base_arguments(parser)
    add_model_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Print where the configuration comes from, then the configuration as JSON."""
    config = build_config(args)
    source = find_config_file(getattr(args, "config", None))
    default = default_config_file()
    if source is None:
        print(f"configuration file: none (no --config, ${CONFIG_ENV} unset, no {default})")
    else:
        print(f"configuration file: {source.path} (from {source.origin})")
    print("precedence: " + PRECEDENCE.format(env=CONFIG_ENV, default=default))
    shown = masked(config.model_dump(mode="json"))
    if args.changed:
        shown = changed(shown, masked(AdaRagConfig().model_dump(mode="json")))
    print(json.dumps(shown, indent=1, ensure_ascii=False))
    return 0


def masked(data: Any, name: str = "") -> Any:
    """A dumped configuration with every secret masked and passwords cut out of URLs."""
    if isinstance(data, dict):
        return {key: masked(value, key) for key, value in data.items()}
    if isinstance(data, list):
        return [masked(value, name) for value in data]
    if data is not None and (name in SECRET_FIELDS or _SECRET_NAME.search(name)):
        return MASK
    if isinstance(data, str) and "://" in data:
        return redact_url(data)
    return data


def changed(data: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``data`` that differ from ``defaults``, sections kept only when changed."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        default = defaults.get(key)
        if isinstance(value, dict) and isinstance(default, dict):
            inner = changed(value, default)
            if inner:
                out[key] = inner
        elif value != default:
            out[key] = value
    return out
