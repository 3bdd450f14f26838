"""``adarag chat`` in a pseudo-terminal: a follow-up answered from the right passage, Ctrl-C
cancelling one answer while the chat goes on."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from adarag import AdaRagConfig
from tests.integration.conftest import config_file_with_knowledge_base

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
TURN_END = r"(stop: \w+|answer cancelled)[\s\S]*>>> "  # an answer's figures, then the prompt


class Terminal:
    """A process on a pseudo-terminal; what it prints is collected as it comes."""

    def __init__(self, argv: list[str]) -> None:
        self.master, slave = pty.openpty()
        self.process = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, cwd=REPO, preexec_fn=_own_terminal
        )
        os.close(slave)
        self.output = ""

    def expect(self, pattern: str, timeout: float = 120.0) -> str:
        """Read until ``pattern`` appears after what was matched before; return what was read."""
        start = len(self.output)
        deadline = time.monotonic() + timeout
        while not re.search(pattern, self.output[start:]):
            if time.monotonic() > deadline:
                raise AssertionError(f"{pattern!r} never came; output:\n{self.output}")
            ready, _, _ = select.select([self.master], [], [], 0.5)
            if ready:
                try:
                    self.output += os.read(self.master, 4096).decode(errors="replace")
                except OSError:  # the process ended
                    raise AssertionError(f"ended before {pattern!r}:\n{self.output}") from None
        return self.output[start:]

    def send(self, text: str) -> None:
        os.write(self.master, text.encode())

    def close(self) -> int:
        try:
            return self.process.wait(timeout=60)
        finally:
            os.close(self.master)


def _own_terminal() -> None:
    """In the child: a session whose controlling terminal is the pty (so Ctrl-C is SIGINT).

    SIGINT gets its default disposition back, as a user's shell gives it: a test runner started
    in the background by a non-interactive shell ignores it, and children inherit that.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


@pytest.fixture(scope="module")
def chat_config(real_config, shared_rag, corpus_path, tmp_path_factory) -> Path:
    """A knowledge base of its own (the shared one is held by the test process)."""
    directory = tmp_path_factory.mktemp("chat-kb")
    config = AdaRagConfig.build(
        real_config,
        retrieval={"chroma_directory": str(directory / "chroma"), "collection": "chat", "top_k": 3},
        augment={"enabled": False},
    )
    return config_file_with_knowledge_base(config, corpus_path, shared_rag.tokenizer, directory)


def test_a_chat_follow_up_and_a_cancelled_answer(chat_config):
    terminal = Terminal(
        [
            str(Path(sys.executable).parent / "adarag"),
            "--config",
            str(chat_config),
            "chat",
            "--max-new-tokens",
            "48",
        ]
    )
    terminal.expect(r">>> ")
    terminal.send("Who was the mother of Lothair II?\r")
    first = terminal.expect(TURN_END)
    assert "Ermengarde of Tours" in first  # a source of the answer
    terminal.send("Where was she born?\r")
    follow_up = terminal.expect(TURN_END)
    # retrieved with the first question: the mother's passage is a source of the follow-up
    assert "Ermengarde of Tours" in follow_up and "Earlier answer" not in follow_up
    terminal.send("Tell me everything about Lothair II.\r")
    terminal.expect(r"about Lothair II\.\r\n\S")  # the answer has begun streaming
    terminal.send("\x03")  # Ctrl-C
    cancelled = terminal.expect(TURN_END)
    assert "answer cancelled" in cancelled and "Traceback" not in cancelled
    terminal.send("Who was the mother of Lothair II?\r")
    assert "Ermengarde of Tours" in terminal.expect(TURN_END)  # the chat goes on
    terminal.send("exit\r")
    assert terminal.close() == 0
    assert "Traceback" not in terminal.output


def test_ctrl_c_before_the_first_token_cancels_only_that_answer(chat_config):
    """Regression: Ctrl-C during retrieval or prefill ended the chat with a traceback."""
    argv = [sys.executable, "-m", "adarag", "chat", "--config", str(chat_config)]
    terminal = Terminal([*argv, "--max-new-tokens", "16"])
    terminal.expect(r">>> ")
    terminal.send("Which film was released first, Aas Ka Panchhi or Phoolwari?\r")
    terminal.expect(r"Phoolwari\?\r\n")  # the line is read: retrieval and prefill begin
    time.sleep(0.05)
    terminal.send("\x03")  # Ctrl-C
    cancelled = terminal.expect(TURN_END)
    # nothing of the answer was printed (the terminal echoes ^C): cancelled before its first token
    assert re.match(r"(\^C)?\s*\(answer cancelled", cancelled), cancelled
    terminal.send("Who was the mother of Lothair II?\r")
    assert "Ermengarde of Tours" in terminal.expect(TURN_END)  # the chat goes on
    terminal.send("exit\r")
    assert terminal.close() == 0
    assert "Traceback" not in terminal.output


def test_version_module_entry_point_and_options_after_the_command(tmp_path):
    """``adarag --version``, ``python -m adarag`` and ``adarag chat --config FILE``."""
    version = Terminal([sys.executable, "-m", "adarag", "--version"])
    assert re.search(r"^adarag \d+\.\d+", version.expect(r"adarag \S+\r\n"))
    assert version.close() == 0
    config = AdaRagConfig.build(
        retrieval={"chroma_directory": str(tmp_path / "chroma"), "collection": "nowhere"}
    )
    path = tmp_path / "config.json"
    path.write_text(config.model_dump_json())
    chat = Terminal([sys.executable, "-m", "adarag", "chat", "--config", str(path), "-v"])
    # the file given after the command was read: its collection is the one looked for
    chat.expect(r"there is no collection 'nowhere'")
    assert chat.close() == 2
