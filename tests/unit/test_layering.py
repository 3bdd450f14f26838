"""Imports point down the stack (docs/ARCHITECTURE.md, layers), checked on the source's AST.

Every module belongs to a layer: its top-level package or module under ``adarag``. Serving
layers (what answers a request) never import tooling (benchmarks, calibration, profiling, the
command line).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "adarag"

SERVING = {
    "config",
    "schema",
    "kv",
    "errors",
    "files",
    "kernels",
    "cache",
    "retrievers",
    "augment",
    "engine",
    "profiles",
    "pipeline",
    "conversation",
    "data",
    "serve",
}
TOOLING = {"evaluation", "cli", "__main__"}

# layer -> adarag layers it may import (itself included where it has several modules)
ALLOWED = {
    "config": {"errors"},  # ConfigError is raised at the config boundary
    "schema": set(),
    "kv": set(),  # ChunkKV, the value the engine computes and the cache stores
    "errors": set(),
    "files": set(),
    "kernels": {"config", "errors", "kernels"},
    "cache": {"config", "schema", "kv", "errors", "files", "cache"},
    "retrievers": {"config", "schema", "errors", "files", "retrievers"},
    "augment": {"config", "schema", "errors", "augment"},
    "engine": {"kernels", "config", "schema", "kv", "errors", "engine"},
    "profiles": {"errors", "profiles"},
    "conversation": {"schema"},
    "data": {"schema", "retrievers"},
    "pipeline": SERVING - {"conversation", "data", "serve"},
    "serve": SERVING,
    "evaluation": SERVING | {"evaluation"},
    "cli": SERVING | TOOLING,
    "__main__": {"cli"},  # python -m adarag
}
FORBIDDEN_THIRD_PARTY = {
    "kv": {"chromadb", "llama_index", "langchain_core", "vllm", "triton"},
    "kernels": {"chromadb", "llama_index", "langchain_core", "vllm"},
    "cache": {"chromadb", "llama_index", "langchain_core", "vllm", "triton"},
    "augment": {"torch", "chromadb", "llama_index", "langchain_core", "vllm", "triton"},
    "profiles": {"torch", "chromadb", "llama_index", "langchain_core", "vllm", "triton"},
}


def _module(path: Path) -> str:
    relative = path.relative_to(ROOT).with_suffix("")
    return ".".join(part for part in relative.parts if part != "__init__")


def _layer(module: str) -> str:
    return module.split(".")[0]


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


MODULES = sorted(p for p in ROOT.rglob("*.py") if p.parent != ROOT or p.name != "__init__.py")


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_module_imports_only_lower_layers(path):
    layer = _layer(_module(path))
    assert layer in ALLOWED, f"{path} belongs to no layer; add {layer!r} to the table"
    for name in _imports(path):
        top, _, rest = name.partition(".")
        if top == "adarag":
            target = _layer(rest)
            assert target in ALLOWED[layer], f"{path.name} ({layer}) imports adarag.{rest}"
        assert top not in FORBIDDEN_THIRD_PARTY.get(layer, set()), f"{path.name} imports {top}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_serving_never_imports_tooling(path):
    if _layer(_module(path)) not in SERVING:
        return
    for name in _imports(path):
        top, _, rest = name.partition(".")
        if top == "adarag":
            assert _layer(rest) not in TOOLING, f"serving module {path.name} imports {name}"


def test_engine_imports_only_public_kernel_names():
    for path in (ROOT / "engine").rglob("*.py"):
        for name in _imports(path):
            assert not name.startswith("adarag.kernels."), f"{path.name} imports {name}"
