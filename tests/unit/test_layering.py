"""Imports point down the stack (STYLE.md section 2), checked on the source's AST."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "adarag"

# layer -> adarag layers it may import
ALLOWED = {
    "config": {"errors"},  # ConfigError is raised at the config boundary
    "schema": set(),
    "errors": set(),
    "kernels": {"config", "errors", "kernels"},
    "cache": {"config", "schema", "errors", "cache"},
    "retrievers": {"config", "schema", "errors", "retrievers"},
    "augment": {"config", "schema", "errors", "augment"},
    "engine": {"kernels", "cache", "config", "schema", "errors", "engine"},
}
FORBIDDEN_THIRD_PARTY = {
    "kernels": {"chromadb", "llama_index", "langchain_core", "vllm"},
    "cache": {"chromadb", "llama_index", "langchain_core", "vllm", "triton"},
    "augment": {"torch", "chromadb", "llama_index", "langchain_core", "vllm", "triton"},
}


def _layer(path: Path) -> str:
    relative = path.relative_to(ROOT)
    return relative.parts[0].removesuffix(".py")


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", sorted(ROOT.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_imports_only_lower_layers(path):
    layer = _layer(path)
    if layer not in ALLOWED:
        return  # pipeline, cli and __init__ may import every core layer
    for name in _imports(path):
        top, _, rest = name.partition(".")
        if top == "adarag":
            target = rest.split(".")[0]
            assert target in ALLOWED[layer], f"{path.name} ({layer}) imports adarag.{target}"
        assert top not in FORBIDDEN_THIRD_PARTY.get(layer, set()), f"{path.name} imports {top}"


def test_engine_imports_only_public_kernel_names():
    for path in (ROOT / "engine").rglob("*.py"):
        for name in _imports(path):
            assert not name.startswith("adarag.kernels."), f"{path.name} imports {name}"
