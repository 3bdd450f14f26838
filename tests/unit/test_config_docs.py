"""docs/config.md is what scripts/config_docs.py writes from the config's field descriptions."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "config_docs.py"
REFERENCE = ROOT / "docs" / "config.md"


def _render() -> str:
    spec = importlib.util.spec_from_file_location("config_docs", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.render()


def test_the_configuration_reference_is_current():
    rendered = _render()
    assert REFERENCE.read_text() == rendered, (
        "docs/config.md is stale; run python scripts/config_docs.py"
    )


def test_the_reference_lists_every_setting():
    from adarag.config import AdaRagConfig, RecomputeConfig, StoreConfig

    rendered = _render()
    for model in (AdaRagConfig, RecomputeConfig, StoreConfig):
        for name, field in model.model_fields.items():
            if not (
                isinstance(field.annotation, type) and hasattr(field.annotation, "model_fields")
            ):
                assert f"| `{name}` |" in rendered, name
    assert "## `cache.recompute`" in rendered
