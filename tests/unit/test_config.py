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


def test_vllm_server_backend_needs_urls_of_http_servers():
    urls = ("http://127.0.0.1:8000", "https://vllm-2.internal")
    config = AdaRagConfig.build(engine={"backend": "vllm-server", "vllm_server_urls": urls})
    assert config.engine.vllm_server_urls == urls
    with pytest.raises(ConfigError, match="needs engine.vllm_server_urls"):
        AdaRagConfig.build(engine={"backend": "vllm-server"})
    with pytest.raises(ConfigError, match="must look like http://host:port"):
        AdaRagConfig.build(engine={"backend": "vllm-server", "vllm_server_urls": ("vllm:8000",)})
