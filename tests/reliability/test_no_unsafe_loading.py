"""Static scan: nothing in adarag or its integrations unpickles, runs checkpoint code or evals.

Every ``.py`` file under ``adarag/`` and ``integrations/`` is parsed (AST, not grep: comments,
strings and methods that merely share a name, like ``model.eval()``, are not findings) and
checked for:

* pickle-family modules (``pickle``, ``cPickle``, ``dill``, ``joblib``, ...) imported or
  loaded by name;
* ``torch.load`` without ``weights_only=True`` (and, stricter, ``torch.load`` at all: model
  weights and KV files are read with safetensors only), ``torch.jit.load``,
  ``numpy.load(allow_pickle=True)``, ``pandas.read_pickle``, ``yaml.load`` without a safe
  loader;
* ``trust_remote_code=True`` anywhere (keyword, dict entry or assignment);
* calls of the builtins ``eval`` and ``exec``.

Findings name ``file:line``. A second test scans planted unsafe snippets to show each rule fires.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("adarag", "integrations")

PICKLE_MODULES = frozenset(
    {"pickle", "cPickle", "_pickle", "dill", "joblib", "cloudpickle", "shelve", "marshal"}
)
UNSAFE_CALLS = {
    "torch.jit.load": "torch.jit.load runs TorchScript from the file",
    "torch.serialization.load": "torch.serialization.load unpickles",
    "pandas.read_pickle": "pandas.read_pickle unpickles",
    "yaml.unsafe_load": "yaml.unsafe_load builds arbitrary objects",
    "builtins.eval": "eval runs arbitrary code",
    "builtins.exec": "exec runs arbitrary code",
}
SAFE_YAML_LOADERS = frozenset({"SafeLoader", "CSafeLoader", "BaseLoader"})
SAFETENSORS_READERS = {
    "adarag/engine/loader.py": "model weights",
    "adarag/cache/entry_format.py": "KV files",
}


@dataclass(frozen=True)
class Finding:
    """One unsafe construct: ``rule`` is 'unsafe' or 'not-safetensors'."""

    path: str
    line: int
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


class _Scanner(ast.NodeVisitor):
    def __init__(self, path: str) -> None:
        self.path = path
        self.aliases: dict[str, str] = {}  # local name -> dotted origin
        self.findings: list[Finding] = []

    def flag(self, node: ast.AST, message: str, rule: str = "unsafe") -> None:
        self.findings.append(Finding(self.path, getattr(node, "lineno", 0), rule, message))

    # --- imports

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.split(".")[0] in PICKLE_MODULES:
                self.flag(node, f"imports {alias.name} (a pickle-family module)")
            local = alias.asname or alias.name.split(".")[0]
            self.aliases[local] = alias.name if alias.asname else alias.name.split(".")[0]
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if module.split(".")[0] in PICKLE_MODULES:
            self.flag(node, f"imports from {module} (a pickle-family module)")
        for alias in node.names:
            if alias.name in PICKLE_MODULES:
                self.flag(node, f"imports {alias.name} from {module} (a pickle-family module)")
            self.aliases[alias.asname or alias.name] = (
                f"{module}.{alias.name}" if module else alias.name
            )
        self.generic_visit(node)

    # --- calls

    def dotted(self, node: ast.AST) -> str | None:
        """The dotted origin of a called name, through import aliases (None if not static)."""
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = self.dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def visit_Call(self, node: ast.Call) -> None:
        name = self.dotted(node.func)
        keywords = {kw.arg: kw.value for kw in node.keywords if kw.arg}
        if isinstance(node.func, ast.Name) and node.func.id in ("eval", "exec"):
            if node.func.id not in self.aliases:  # the builtin, not an imported function
                self.flag(node, f"calls the builtin {node.func.id}()")
        if name:
            root = name.split(".")[0]
            if root in PICKLE_MODULES:
                self.flag(node, f"calls {name} (a pickle-family module)")
            if name in UNSAFE_CALLS:
                self.flag(node, f"calls {name}: {UNSAFE_CALLS[name]}")
            if name == "torch.load":
                if not _is_true(keywords.get("weights_only")):
                    self.flag(node, "calls torch.load without weights_only=True (it unpickles)")
                self.flag(
                    node,
                    "calls torch.load: model weights and KV files must be read with safetensors",
                    rule="not-safetensors",
                )
            if name in ("numpy.load", "np.load") and _is_true(keywords.get("allow_pickle")):
                self.flag(node, f"calls {name} with allow_pickle=True (it unpickles)")
            if name == "yaml.load" and not _is_safe_yaml_loader(keywords.get("Loader")):
                self.flag(node, "calls yaml.load without a safe Loader")
            if name in ("importlib.import_module", "__import__") and node.args:
                target = node.args[0]
                if isinstance(target, ast.Constant) and str(target.value).split(".")[0] in (
                    PICKLE_MODULES
                ):
                    self.flag(node, f"imports {target.value} dynamically (a pickle-family module)")
        if "trust_remote_code" in keywords and _is_true(keywords["trust_remote_code"]):
            self.flag(node, "passes trust_remote_code=True (runs code from a checkpoint)")
        self.generic_visit(node)

    # --- trust_remote_code outside keyword arguments

    def visit_Dict(self, node: ast.Dict) -> None:
        for key, value in zip(node.keys, node.values, strict=True):
            if (
                isinstance(key, ast.Constant)
                and key.value == "trust_remote_code"
                and _is_true(value)
            ):
                self.flag(node, "sets trust_remote_code to True in a dict")
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
            if name == "trust_remote_code" and _is_true(node.value):
                self.flag(node, "assigns trust_remote_code = True")
        self.generic_visit(node)


def _is_true(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _is_safe_yaml_loader(node: ast.AST | None) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr in SAFE_YAML_LOADERS
    return isinstance(node, ast.Name) and node.id in SAFE_YAML_LOADERS


def scan_source(source: str, path: str = "<snippet>") -> list[Finding]:
    """Every unsafe-loading finding of one module's source."""
    scanner = _Scanner(path)
    scanner.visit(ast.parse(source, filename=path))
    return scanner.findings


def source_files() -> list[Path]:
    files = [path for folder in SCANNED for path in sorted((ROOT / folder).rglob("*.py"))]
    return [path for path in files if ".venv" not in path.parts]


def test_adarag_and_integrations_load_nothing_unsafely(ledger):
    files = source_files()
    assert len(files) > 50, f"only {len(files)} files found under {SCANNED}"
    findings = []
    for path in files:
        relative = str(path.relative_to(ROOT))
        findings.extend(scan_source(path.read_text(encoding="utf-8"), relative))
    dirty = {finding.path for finding in findings}
    ledger.record(
        "unsafe loading (static scan)", cases=len(files), detected=len(files) - len(dirty)
    )
    assert not findings, "unsafe loading:\n" + "\n".join(map(str, findings))


def test_model_weights_and_kv_files_are_read_with_safetensors():
    for relative, what in SAFETENSORS_READERS.items():
        tree = ast.parse((ROOT / relative).read_text(encoding="utf-8"))
        imported = {
            node.module.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module
        } | {
            alias.name.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
        }
        assert "safetensors" in imported, f"{relative} reads {what} but does not use safetensors"
        assert "pickle" not in imported and "torch.load" not in ast.unparse(tree), relative


def test_the_checkpoint_tokenizer_is_loaded_without_remote_code():
    """The one place a user's checkpoint directory meets transformers' Auto classes."""
    tree = ast.parse((ROOT / "adarag/engine/checkpoint.py").read_text(encoding="utf-8"))
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "from_pretrained"
    ]
    assert calls, "adarag/engine/checkpoint.py loads no tokenizer with from_pretrained"
    for call in calls:
        keywords = {kw.arg: kw.value for kw in call.keywords}
        value = keywords.get("trust_remote_code")
        assert isinstance(value, ast.Constant) and value.value is False, (
            f"adarag/engine/checkpoint.py:{call.lineno}: from_pretrained must pass "
            "trust_remote_code=False (never the interactive default)"
        )
        offline = keywords.get("local_files_only")
        assert isinstance(offline, ast.Constant) and offline.value is True, call.lineno


UNSAFE_SNIPPETS = {
    "pickle.loads": "import pickle\n\ndata = pickle.loads(blob)\n",
    "from pickle import loads": "from pickle import loads\nx = loads(b)\n",
    "import cPickle": "import cPickle as p\n",
    "from six.moves import cPickle": "from six.moves import cPickle\n",
    "dill": "import dill\n",
    "joblib": "from joblib import load\nmodel = load('m.joblib')\n",
    "dynamic pickle import": "import importlib\nm = importlib.import_module('pickle')\n",
    "__import__ pickle": "m = __import__('pickle')\n",
    "torch.load": "import torch\nstate = torch.load('w.bin')\n",
    "torch.load weights_only=False": "import torch\ns = torch.load(f, weights_only=False)\n",
    "aliased torch.load": "import torch as t\ns = t.load(f)\n",
    "from torch import load": "from torch import load\ns = load(f)\n",
    "torch.jit.load": "import torch\nm = torch.jit.load('m.pt')\n",
    "numpy allow_pickle": "import numpy as np\na = np.load('a.npy', allow_pickle=True)\n",
    "pandas.read_pickle": "import pandas as pd\ndf = pd.read_pickle('x')\n",
    "yaml.load": "import yaml\ncfg = yaml.load(text)\n",
    "trust_remote_code keyword": (
        "from transformers import AutoModel\nm = AutoModel.from_pretrained(p, "
        "trust_remote_code=True)\n"
    ),
    "trust_remote_code in a dict": "kwargs = {'trust_remote_code': True}\n",
    "trust_remote_code assigned": "config.trust_remote_code = True\n",
    "eval": "x = eval(text)\n",
    "exec": "exec(code, {})\n",
    "builtins.eval": "import builtins\nbuiltins.eval(text)\n",
}
SAFE_SNIPPETS = {
    "method named eval": "model.eval()\nmodel.to('cpu').eval().requires_grad_(False)\n",
    "method named exec": "cursor.execute('select 1')\nengine.exec_step()\n",
    "json.loads": "import json\nx = json.loads(s)\n",
    "safetensors": "from safetensors.torch import load_file\nw = load_file(p, device='cpu')\n",
    "trust_remote_code=False": (
        "from transformers import AutoTokenizer\nt = AutoTokenizer.from_pretrained(p, "
        "trust_remote_code=False)\n"
    ),
    "yaml.safe_load": (
        "import yaml\na = yaml.safe_load(t)\nb = yaml.load(t, Loader=yaml.SafeLoader)\n"
    ),
    "words in strings and comments": "# torch.load, pickle.loads, eval(\ns = 'import pickle'\n",
    "numpy without pickles": "import numpy as np\na = np.load('a.npy')\n",
}


@pytest.mark.parametrize("name", list(UNSAFE_SNIPPETS))
def test_the_scan_flags_each_unsafe_pattern_with_its_line(ledger, name):
    source = "'''a module'''\n\n" + UNSAFE_SNIPPETS[name]  # unsafe code starts on line 3
    findings = scan_source(source, "planted.py")
    flagged = any(finding.rule == "unsafe" for finding in findings)
    ledger.record("unsafe loading (static scan)", cases=1, detected=int(flagged))
    assert flagged, f"{name}: not flagged"
    assert all(finding.line >= 3 for finding in findings), findings
    assert all(str(finding).startswith("planted.py:") for finding in findings)


def test_a_planted_pickle_loads_in_a_package_file_would_fail_the_scan():
    """What the package test sees if someone adds ``pickle.loads`` to the KV reader."""
    relative = "adarag/cache/disk.py"
    source = (ROOT / relative).read_text(encoding="utf-8")
    planted = (
        source + "\n\ndef _load_legacy(blob):\n    import pickle\n    return pickle.loads(blob)\n"
    )
    findings = scan_source(planted, relative)
    lines = planted.splitlines()
    assert findings and all(finding.path == relative for finding in findings)
    assert {lines[finding.line - 1].strip() for finding in findings} == {
        "import pickle",
        "return pickle.loads(blob)",
    }
    assert not scan_source(source, relative)


@pytest.mark.parametrize("name", list(SAFE_SNIPPETS))
def test_the_scan_leaves_safe_code_alone(name):
    assert scan_source(SAFE_SNIPPETS[name]) == [], name
