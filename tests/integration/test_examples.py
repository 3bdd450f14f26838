"""Each example runs offline as written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("llama_index_app.py", ["sources:", "TTFT", "usage"]),
        ("langchain_lcel.py", ["sources:", "batch answer:", "usage"]),
        ("chroma_chatbot.py", ["you> When did she die?", "TTFT", "source ["]),
    ],
)
def test_example_runs_offline(real_config, script, expected):
    # The examples use the default model: point them at the home it was provisioned in.
    home = Path(real_config.engine.model).parents[1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ADARAG_HOME": str(home)}
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for text in expected:
        assert text in result.stdout, result.stdout[-2000:]
