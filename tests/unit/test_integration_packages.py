"""Integrations are leaves on the public API (docs/ARCHITECTURE.md, layers), with pinned exports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "llama_index": ROOT / "integrations" / "llama_index" / "llama_index" / "packs" / "adarag",
    "langchain": ROOT / "integrations" / "langchain" / "langchain_adarag",
}
PUBLIC_ADARAG = {
    "adarag",
    "adarag.config",
    "adarag.errors",
    "adarag.pipeline",
    "adarag.retrievers",
    "adarag.schema",
}
OTHER_FRAMEWORK = {"llama_index": "langchain", "langchain": "llama_index"}


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("framework", sorted(PACKAGES))
def test_integration_uses_only_the_public_api_and_not_the_other_integration(framework):
    for path in PACKAGES[framework].rglob("*.py"):
        for name in _imports(path):
            if name.split(".")[0] == "adarag":
                assert name in PUBLIC_ADARAG, f"{path.name} imports {name}"
            assert not name.startswith(OTHER_FRAMEWORK[framework]), f"{path.name} imports {name}"


def test_core_never_imports_an_integration():
    for path in (ROOT / "adarag").rglob("*.py"):
        for name in _imports(path):
            assert not name.startswith(("llama_index.packs", "langchain_adarag")), path


def test_integration_exports_are_pinned():
    llama_index = pytest.importorskip("llama_index.packs.adarag")
    langchain = pytest.importorskip("langchain_adarag")
    assert sorted(llama_index.__all__) == [
        "AdaRagEmbedding",
        "AdaRagLLM",
        "AdaRagRetriever",
        "AdaptiveCachedQueryEngine",
        "AdaptiveChatEngine",
        "AdaptiveStepEvent",
        "AdaptiveStopEvent",
    ]
    assert sorted(langchain.__all__) == [
        "AdaRagEmbeddings",
        "AdaptiveCachedRAG",
        "AdaptiveCachedRetriever",
        "ChatAdaRag",
    ]
