"""The configuration tree: overrides, validation, immutability."""

from __future__ import annotations

import json

import pydantic
import pytest

from adarag.config import (
    AdaRagConfig,
    CacheConfig,
    ExperimentalConfig,
    RecomputeConfig,
    RecomputeLevers,
    RecomputeSettings,
)
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
    with pytest.raises(ConfigError, match="remove hard.recompute_ratio"):
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
    path.write_text(json.dumps({"experimental": {"augment": {"num_lens_layers": 3}}}))
    assert AdaRagConfig.from_file(path).experimental.augment.num_lens_layers == 3
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


def test_a_file_of_the_old_layout_loads_its_moved_keys_and_names_where_they_went(tmp_path, caplog):
    path = tmp_path / "config.json"
    old = {
        "cache": {
            "hard": {"enabled": True, "recompute_ratio": 0.0},
            "fusion": {"enabled": True},
            "reorder": "longest_prefix",
            "recompute": {"selection_policy": "kv_deviation", "layer_schedule": "gradual"},
        },
        "augment": {"enabled": False, "num_lens_layers": 3},
        "chat": {"deduplicate": True},
    }
    path.write_text(json.dumps(old))
    with caplog.at_level("WARNING", logger="adarag.config.experimental"):
        config = AdaRagConfig.from_file(path)
    experimental = config.experimental
    assert experimental.fusion.enabled and experimental.arrangement.reorder == "longest_prefix"
    assert experimental.recompute.layer_schedule == "gradual"
    assert experimental.augment.num_lens_layers == 3 and experimental.arrangement.deduplicate
    assert config.cache.recompute.selection_policy == "kv_deviation" and not config.augment.enabled
    assert config.selection.layer_schedule == "gradual"
    assert "cache.fusion moved to experimental.fusion" in caplog.text
    assert "augment.num_lens_layers moved to experimental.augment.num_lens_layers" in caplog.text
    assert json.loads(path.read_text()) == old  # the file is only read


def test_a_moved_key_is_refused_by_its_old_section_and_controls_stay_per_request():
    with pytest.raises(pydantic.ValidationError, match="fusion"):
        CacheConfig(fusion={"enabled": True})
    with pytest.raises(ConfigError, match="selection_policy"):  # controls are per request only
        AdaRagConfig.build(cache={"recompute": {"selection_policy": "oracle"}})
    assert RecomputeConfig(selection_policy="oracle").selection_policy == "oracle"


def _settings(model: type[pydantic.BaseModel]) -> int:
    count = 0
    for field in model.model_fields.values():
        section = field.annotation
        is_section = isinstance(section, type) and issubclass(section, pydantic.BaseModel)
        count += _settings(section) if is_section else 1
    return count


def test_the_user_config_keeps_research_levers_in_experimental():
    total = _settings(AdaRagConfig)
    # 95, then the packet (cache.recompute.packet) and the server's origin, host, upload and
    # parse bounds (serve.allowed_origins, allowed_hosts, max_connections_per_address,
    # max_concurrent_uploads, retrieval.max_parse_seconds): each one a user decides
    assert total - _settings(ExperimentalConfig) <= 101
    assert set(RecomputeLevers.model_fields).isdisjoint(RecomputeSettings.model_fields)
