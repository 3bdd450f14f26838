"""docs/scaling.md section 5 runs as pasted: a ``vllm serve`` replica and ``adarag serve`` in front.

Regression (issue 47): the section's front end listened on the replica's port, the replica
listened on every interface with no API key and lacked the CPU sizing ``serve_command`` adds,
and its ``adarag.json`` was never shown. The test takes the section's code blocks in order (the
shared secrets, ``adarag.json``, the replica, ingest and the front end, the request), moves the
two ports and the hand-over directory to ones of its own, and runs them with bash on this
machine's CPU: the front end must pass the blending gate through the replica (so the replica
read its hand-overs) and answer; no secret may appear on a command line.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from adarag.engine.vllm.launch import free_port, serve_command

pytestmark = [pytest.mark.integration, pytest.mark.vllm]
ROOT = Path(__file__).resolve().parents[2]
SCALING = ROOT / "docs" / "scaling.md"
DOC_PORTS = {"8000": "replica", "8100": "front end"}
DOC_HANDOFF = "/dev/shm/adarag-handoff"


def _section_blocks() -> list[tuple[str, str]]:
    """(language, text) of each code block of section 5's "Start it on one machine"."""
    text = SCALING.read_text()
    start = text.index("**Start it on one machine.**")
    end = text.index("`adarag.engine.vllm.launch.serve_command` builds", start)
    return re.findall(r"```(\w+)\n(.*?)```", text[start:end], re.DOTALL)


def _one_line(command: str) -> str:
    return command.replace("\\\n", " ")


def _with_parsed_json(words: list[str]) -> list[object]:
    """``words`` with the connector's JSON parsed (the doc spreads it over lines)."""
    at = words.index("--kv-transfer-config") + 1
    return [*words[:at], json.loads(words[at]), *words[at + 1 :]]


def test_the_docs_replica_command_is_serve_commands():
    """The replica's flags are the ones serve_command adds (CPU sizing, loopback, the connector)."""
    words = shlex.split(_one_line(_section_blocks()[2][1]))
    expected = serve_command(Path("$MODEL"), 8000, DOC_HANDOFF)
    assert words[0] == "python"  # serve_command's is sys.executable
    assert _with_parsed_json(words[1:]) == _with_parsed_json(expected[1:])
    assert words[words.index("--host") + 1] == "127.0.0.1"


@contextmanager
def _started(command: str, env: dict[str, str], cwd: Path, log: Path) -> Iterator[int]:
    """``command`` under bash in a process group of its own, ended with the block."""
    with log.open("w") as out:
        process = subprocess.Popen(
            ["bash", "-c", command],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield process.pid
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _bash(script: str, env: dict[str, str], cwd: Path) -> str:
    """What ``script`` printed; it must succeed."""
    done = subprocess.run(
        ["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, (script, done.stderr[-3000:])
    return done.stdout


def _wait_for(url: str, headers: dict[str, str], log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, headers=headers, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    pytest.fail(f"{url} did not answer within {timeout_s} s:\n{log.read_text()[-3000:]}")


def _command_lines(group: int) -> list[str]:
    """The command lines of every process of a process group."""
    lines = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and os.getpgid(int(proc.name)) == group:
                lines.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except (OSError, ProcessLookupError):
            continue
    return lines


def test_section_5_runs_as_pasted(real_config, tmp_path):
    secrets, config, replica, start, ask = (text for _, text in _section_blocks())
    ports = {doc: str(free_port()) for doc in DOC_PORTS}
    handoff = str(tmp_path / "adarag-handoff")

    def local(text: str) -> str:  # this test's ports and hand-over directory
        text = text.replace(DOC_HANDOFF, handoff)
        for doc, port in ports.items():
            text = text.replace(f":{doc}", f":{port}").replace(f"--port {doc}", f"--port {port}")
        return text

    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    (home / "models").symlink_to(Path(real_config.engine.model).parent)
    (work / "docs").mkdir(parents=True)
    (work / "docs" / "handoff.md").write_text(
        "# The hand-over\n\nThe front end hands the fused KV of the whole prompt to a vLLM "
        "replica, which decodes the answer.\n"
    )
    (work / "adarag.json").write_text(local(config))
    bin_dir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "ADARAG_HOME": str(home),
        "HF_HUB_OFFLINE": "1",
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT),  # this checkout's adarag, in the replica's connector too
        "OMP_NUM_THREADS": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    }
    shown = _bash(
        f'{secrets}\nprintf "%s\\n" "$ADARAG_HANDOFF_KEY" "$VLLM_API_KEY" "$MODEL"', env, work
    )
    handoff_key, api_key, model = shown.split("\n")[:3]
    assert len(handoff_key) == len(api_key) == 64 and Path(model).is_dir()
    env.update(ADARAG_HANDOFF_KEY=handoff_key, VLLM_API_KEY=api_key, MODEL=model)
    auth = {"Authorization": f"Bearer {api_key}"}
    ingest, serve = start.strip().splitlines()

    with _started(local(replica), env, work, tmp_path / "replica.log") as replica_group:
        replica_url = f"http://127.0.0.1:{ports['8000']}"
        _wait_for(f"{replica_url}/v1/models", auth, tmp_path / "replica.log", 900)
        assert httpx.get(f"{replica_url}/v1/models", timeout=10).status_code == 401  # key needed
        _bash(ingest, env, work)
        front_log = tmp_path / "front_end.log"
        with _started(local(serve), env, work, front_log) as front_group:
            front_url = f"http://127.0.0.1:{ports['8100']}"
            _wait_for(f"{front_url}/health", {}, front_log, 900)
            answer = _bash(local(ask), env, work)
            command_lines = _command_lines(replica_group) + _command_lines(front_group)
    reply = json.loads(answer)
    assert reply["choices"][0]["message"]["content"].strip()
    logged = front_log.read_text()
    assert "blending gate passed" in logged, logged[-3000:]  # the replica read the hand-over
    assert not any(secret in line for line in command_lines for secret in (handoff_key, api_key))
    assert "refused" not in (tmp_path / "replica.log").read_text()
