"""The three wheels build, install into a fresh venv with no clone, and run there."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def test_the_wheels_install_into_a_fresh_venv_and_adarag_runs_there(tmp_path):
    """`make wheels`: python -m build, then pip install from dist/ outside the source tree."""
    dist = tmp_path / "dist"
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "wheels.py"), "--dist", str(dist)],
        capture_output=True,
        text=True,
        timeout=1800,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert sorted(path.name for path in dist.glob("*.whl")) == [
        "adarag-0.1.0-py3-none-any.whl",
        "langchain_adarag-0.1.0-py3-none-any.whl",
        "llama_index_packs_adarag-0.1.0-py3-none-any.whl",
    ]
    assert "`adarag --version`: adarag 0.1.0" in result.stdout
