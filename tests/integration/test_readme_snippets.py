"""The READMEs' Python snippets run as pasted: the project's, and the LangChain package's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from adarag import AdaRagConfig
from adarag.retrievers import KnowledgeBase

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "integrations" / "langchain" / "README.md"
PROJECT_README = ROOT / "README.md"


def _python_blocks(path: Path) -> list[str]:
    """The ```python blocks, which run as pasted (```py marks a fragment of a larger program)."""
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.DOTALL)


def _provisioned_home(real_config, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A fresh home whose models are the provisioned ones, and the environment naming it."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(Path(real_config.engine.model).parent)
    return home, {**os.environ, "ADARAG_HOME": str(home), "HF_HUB_OFFLINE": "1"}


def _run(arguments: list[str], env: dict[str, str], cwd: Path | None = None):
    """``python ARGUMENTS`` in a subprocess, which must succeed."""
    result = subprocess.run(
        [sys.executable, *arguments],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_the_langchain_readme_snippets_run_as_pasted(
    real_config, shared_rag, corpus_path, tmp_path
):
    """Regression: the first snippet raised NameError: name 'config' is not defined.

    The snippets use the default configuration: a home whose default knowledge base holds the
    corpus (as `adarag ingest` leaves it) and whose models are the provisioned ones.
    """
    pytest.importorskip("langchain_adarag")
    home, env = _provisioned_home(real_config, tmp_path)
    with KnowledgeBase.from_config(AdaRagConfig.build(home=home)) as kb:
        kb.ingest([corpus_path], tokenizer=shared_rag.tokenizer)
    blocks = _python_blocks(README)
    assert len(blocks) == 2  # the chain, then the conversation recipe
    result = _run(["-c", "\n".join(blocks)], env)
    assert result.stdout.strip()  # the conversation's answers
    assert all("with KnowledgeBase.from_config(config) as kb:" in block for block in blocks)
    _assert_next_command_finds_the_lock_released(home, env, tmp_path)


def test_a_knowledge_base_left_open_is_released_at_interpreter_exit(real_config, tmp_path):
    """Regression: an unclosed KnowledgeBase left its pid in the lock, and the next command
    warned that it "recovered the lock ... left by pid ...", as after an interrupted ingest."""
    home, env = _provisioned_home(real_config, tmp_path)
    script = (
        "from adarag import AdaRAG, AdaRagConfig\n"
        "from adarag.retrievers import KnowledgeBase\n"
        "config = AdaRagConfig()\n"
        "rag = AdaRAG(config, retriever=KnowledgeBase.from_config(config))  # never closed\n"
        "print(rag.retriever.count())\n"
    )
    _run(["-c", script], env)
    assert (home / "chroma" / "adarag.lock").read_text() == ""  # no pid left behind
    _assert_next_command_finds_the_lock_released(home, env, tmp_path)


def _assert_next_command_finds_the_lock_released(home: Path, env: dict, tmp_path: Path) -> None:
    notes = tmp_path / "more-notes.md"
    notes.write_text("# More\n\nThe next meeting is on Friday.\n")
    result = _run(["-m", "adarag", "ingest", str(notes), "--no-warm"], env, cwd=ROOT)
    assert "recovered the lock" not in result.stderr and "left by pid" not in result.stderr
    assert "ingested 1 file(s)" in result.stdout


def test_the_project_readme_example_runs_as_pasted(real_config, tmp_path):
    """The README's example ingests ``notes.md`` from the working directory and answers from it."""
    _, env = _provisioned_home(real_config, tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.md").write_text(
        "# Notes\n\nThe meeting moved to Thursday. X is the code name of the new search service.\n"
    )
    blocks = _python_blocks(PROJECT_README)
    assert len(blocks) == 1  # the knowledge-base example
    script = blocks[0] + "\nprint(answer.text, len(answer.chunks), answer.trace.ttft_s)\n"
    result = _run(["-c", script], env, cwd=work)
    assert result.stdout.strip()
