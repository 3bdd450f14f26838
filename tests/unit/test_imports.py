"""The public API, and what `import adarag` must not pull in."""

from __future__ import annotations

import subprocess
import sys

import adarag

EXPECTED_ALL = sorted(adarag.__all__)


def test_public_names_are_importable():
    for name in adarag.__all__:
        assert getattr(adarag, name) is not None


def test_import_adarag_pulls_in_no_framework():
    code = (
        "import sys, adarag, adarag.engine.generator, adarag.kernels;"
        "heavy = {'chromadb', 'llama_index', 'langchain_core', 'vllm', 'triton', 'transformers'};"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
