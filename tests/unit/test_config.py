"""The configuration tree: overrides, validation, immutability."""

from __future__ import annotations

import json

import pydantic
import pytest

from adarag.config import AdaRagConfig
from adarag.errors import ConfigError


def test_nested_overrides_are_applied_and_validated():
    config = AdaRagConfig.build(
        cache={"soft": {"recompute_ratio": 0.05}}, engine={"dtype": "bfloat16"}
    )
    assert config.cache.soft.recompute_ratio == 0.05
    assert config.engine.dtype == "bfloat16"
    assert (
        config.cache.independent.recompute_ratio == AdaRagConfig().cache.independent.recompute_ratio
    )


def test_misspelt_key_is_an_error_not_dropped():
    with pytest.raises(ConfigError, match="recompute_ration"):
        AdaRagConfig.build(cache={"soft": {"recompute_ration": 0.05}})


def test_config_is_frozen():
    config = AdaRagConfig()
    with pytest.raises(pydantic.ValidationError):
        config.engine.dtype = "float16"  # type: ignore[misc]


def test_hard_tier_must_not_recompute():
    with pytest.raises(ConfigError, match="hard.recompute_ratio must be 0"):
        AdaRagConfig.build(cache={"hard": {"recompute_ratio": 0.1}})


def test_chroma_url_and_directory_are_exclusive(tmp_path):
    url = "http://127.0.0.1:8000"
    assert AdaRagConfig.build(retrieval={"chroma_url": url}).retrieval.chroma_url == url
    with pytest.raises(ConfigError, match="chroma_url .* and chroma_directory .* are both set"):
        AdaRagConfig.build(retrieval={"chroma_url": url, "chroma_directory": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"chroma_url must be http\(s\)://HOST\[:PORT\]"):
        AdaRagConfig.build(retrieval={"chroma_url": "127.0.0.1:8000"})


def test_home_comes_from_adarag_home(monkeypatch, tmp_path):
    monkeypatch.setenv("ADARAG_HOME", str(tmp_path / "here"))
    assert AdaRagConfig().home == tmp_path / "here"


def test_config_file_round_trip(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"augment": {"num_lens_layers": 3}}))
    assert AdaRagConfig.from_file(path).augment.num_lens_layers == 3
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read configuration file"):
        AdaRagConfig.from_file(path)


HANDOFF_KEY = "a-hand-over-key-of-32-bytes-long"


def test_vllm_server_backend_needs_urls_of_http_servers():
    urls = ("http://127.0.0.1:8000", "https://vllm-2.internal")
    keyed = {"backend": "vllm-server", "vllm_handoff_key": HANDOFF_KEY}
    config = AdaRagConfig.build(engine={**keyed, "vllm_server_urls": urls})
    assert config.engine.vllm_server_urls == urls
    with pytest.raises(ConfigError, match="needs engine.vllm_server_urls"):
        AdaRagConfig.build(engine=keyed)
    with pytest.raises(ConfigError, match="must look like http://host:port"):
        AdaRagConfig.build(engine={**keyed, "vllm_server_urls": ("vllm:8000",)})


def test_vllm_server_backend_needs_a_hand_over_key(monkeypatch, tmp_path):
    monkeypatch.delenv("ADARAG_HANDOFF_KEY", raising=False)
    server = {"backend": "vllm-server", "vllm_server_urls": ("http://127.0.0.1:8000",)}
    with pytest.raises(ConfigError, match=r"signs every hand-over.*\$ADARAG_HANDOFF_KEY"):
        AdaRagConfig.build(engine=server)
    monkeypatch.setenv("ADARAG_HANDOFF_KEY", HANDOFF_KEY)
    engine = AdaRagConfig.build(engine=server).engine
    assert engine.handoff_key_bytes() == HANDOFF_KEY.encode()
    assert HANDOFF_KEY not in repr(engine) and HANDOFF_KEY not in engine.model_dump_json()
    monkeypatch.setenv("ADARAG_HANDOFF_KEY", "short")
    with pytest.raises(ConfigError, match=r"\$ADARAG_HANDOFF_KEY is shorter than 16 bytes"):
        AdaRagConfig.build(engine=server)
    monkeypatch.delenv("ADARAG_HANDOFF_KEY")
    key_file = tmp_path / "handoff.key"
    key_file.write_text(HANDOFF_KEY + "\n")
    key_file.chmod(0o600)
    engine = AdaRagConfig.build(engine={**server, "vllm_handoff_key_file": key_file}).engine
    assert engine.handoff_key_bytes() == HANDOFF_KEY.encode()
    key_file.chmod(0o644)
    with pytest.raises(ConfigError, match=r"open to other users \(mode 0644\).*chmod 600"):
        engine.handoff_key_bytes()
