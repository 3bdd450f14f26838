"""``adarag serve --api-key``, and the warning when serving without a key where others can reach.

The key could only come from ``$ADARAG_API_KEY``; ``--api-key`` now sets it too (as vLLM's
``--api-key`` beside ``VLLM_API_KEY``), and a server listening on an address other than
loopback without a key says so when it starts.
"""

from __future__ import annotations

import pytest

from adarag.cli import build_parser
from adarag.cli.serve import api_key_of, exposure_warning
from adarag.config import ServeConfig
from adarag.errors import ConfigError


def serve_args(*options: str):
    return build_parser(["serve"]).parse_args(["serve", *options])


def test_the_api_key_comes_from_the_option_else_the_environment(monkeypatch, ledger):
    """Before: only ADARAG_API_KEY set the key."""
    config = ServeConfig()
    monkeypatch.setenv("ADARAG_API_KEY", "from-env")
    assert api_key_of(serve_args("--api-key", "from-flag"), config) == ("from-flag", "--api-key")
    assert api_key_of(serve_args(), config) == ("from-env", "$ADARAG_API_KEY")
    monkeypatch.delenv("ADARAG_API_KEY")
    assert api_key_of(serve_args(), config) == (None, "$ADARAG_API_KEY")
    with pytest.raises(ConfigError, match="--api-key is empty"):
        api_key_of(serve_args("--api-key", " "), config)
    ledger.record("CLI: serve --api-key", cases=4)


def test_serving_without_a_key_beyond_loopback_is_warned_of(ledger):
    """Before: no warning when serving without a key on a non-loopback address."""
    for host in ("0.0.0.0", "::", "10.0.0.5", "kb.example.com"):
        warning = exposure_warning(host, None)
        assert warning and host in warning and "--api-key" in warning
    for host in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"):
        assert exposure_warning(host, None) is None
    assert exposure_warning("0.0.0.0", "a-key") is None
    ledger.record("CLI: serve without a key beyond loopback", cases=4)


def test_allowed_origins_and_hosts_have_options():
    args = serve_args("--allowed-origin", "https://app.example.com", "--allowed-host", "kb.lan")
    assert args.allowed_origin == ["https://app.example.com"] and args.allowed_host == ["kb.lan"]
