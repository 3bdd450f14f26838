"""The public API, and what `import adarag` must not pull in."""

from __future__ import annotations

import subprocess
import sys

import adarag
from adarag import __all__ as PUBLIC_NAMES


def test_public_names_are_importable():
    for name in PUBLIC_NAMES:
        assert getattr(adarag, name) is not None


def test_import_adarag_pulls_in_no_framework():
    code = (
        "import sys, adarag, adarag.engine.core, adarag.kernels;"
        "heavy = {'chromadb', 'llama_index', 'langchain_core', 'vllm', 'triton', 'transformers'};"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))"
    )
    assert _python(code) == "[]"


def test_import_adarag_loads_torch_only_when_a_public_name_is_used():
    # the `adarag` command checks its arguments without torch (a bad path is refused at once)
    code = (
        "import sys, adarag, adarag.config, adarag.cli.options;"
        "print('torch' in sys.modules, end=' ');"
        "adarag.AdaRAG;"
        "print('torch' in sys.modules)"
    )
    assert _python(code) == "False True"


def _python(code: str) -> str:
    """What a fresh interpreter running ``code`` prints."""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    return result.stdout.strip()
