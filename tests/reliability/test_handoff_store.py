"""The vLLM hand-over's directory and its leftovers, on both sides, without a replica.

Regression (issue 45): another local user who created the documented ``/dev/shm/adarag-handoff``
first (mode 0777) had it accepted silently, and the files of a killed front end stayed in
``/dev/shm`` (memory) until another front end started. Now the front end and the replica's
connector refuse a directory that another user owns or others may write, and both sweep
hand-overs older than their maximum age.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest
import torch

from adarag.config import AdaRagConfig
from adarag.engine.vllm.handoff import FusedContext, HandoffBinding, prompt_digest
from adarag.engine.vllm.handoff_store import open_front_end_handoff, open_replica_handoff
from adarag.engine.vllm.handoff_sweep import HandoffSweeper
from adarag.errors import ConfigError

KEY = "a-hand-over-key-of-32-bytes-long"
KILLED_FRONT_END = """
import sys, uuid, os, torch
from adarag.engine.vllm.handoff import FusedContext, HandoffBinding, prompt_digest
from adarag.engine.vllm.handoff_store import open_handoff
store = open_handoff(sys.argv[1], sys.argv[2].encode())
for _ in range(3):
    binding = HandoffBinding(uuid.uuid4().hex, prompt_digest([1, 2, 3]), 3)
    store.write(binding, FusedContext(torch.zeros(2, 3, 1, 4), torch.ones(2, 3, 1, 4)))
os._exit(137)  # as kill -9 leaves it: nothing deleted
"""


def _front_end(handoff) -> AdaRagConfig:
    engine = {
        "backend": "vllm-server",
        "vllm_server_urls": ("http://127.0.0.1:9",),
        "vllm_handoff": str(handoff),
        "vllm_handoff_key": KEY,
    }
    return AdaRagConfig.build(engine=engine)


@pytest.mark.parametrize("exposure", ["world-writable", "group-writable", "another user's"])
def test_an_exposed_hand_over_directory_is_refused_on_both_sides(
    tmp_path, monkeypatch, ledger, exposure
):
    if exposure == "another user's" and os.geteuid() != 0:
        pytest.skip("handing a directory to another user needs root")
    handoff = tmp_path / "adarag-handoff"
    handoff.mkdir()
    handoff.chmod({"world-writable": 0o777, "group-writable": 0o770}.get(exposure, 0o700))
    if exposure == "another user's":
        os.chown(handoff, 65534, 65534)
    expected = "belongs to uid 65534" if exposure == "another user's" else "may be written by"
    monkeypatch.setenv("ADARAG_HANDOFF_KEY", KEY)
    refused = []
    for side, opening in (
        ("front end", lambda: open_front_end_handoff(_front_end(handoff).engine)),
        ("replica", lambda: open_replica_handoff({"handoff": str(handoff)})),
    ):
        with pytest.raises(ConfigError) as raised:
            opening()
        refused.append(expected in str(raised.value) and KEY not in str(raised.value))
        assert refused[-1], (side, str(raised.value))
    ledger.record(f"hand-over directory {exposure}", cases=2, detected=sum(refused))


def test_a_replica_without_the_key_refuses_to_start(tmp_path, monkeypatch, ledger):
    monkeypatch.delenv("ADARAG_HANDOFF_KEY", raising=False)
    with pytest.raises(ConfigError, match=r"holds no hand-over key: set \$ADARAG_HANDOFF_KEY"):
        open_replica_handoff({"handoff": str(tmp_path / "handoff")})
    key_file = tmp_path / "handoff.key"
    key_file.write_text(KEY)
    key_file.chmod(0o644)
    with pytest.raises(ConfigError, match=r"open to other users \(mode 0644\)"):
        open_replica_handoff({"handoff": str(tmp_path / "h"), "handoff_key_file": str(key_file)})
    key_file.chmod(0o600)
    store, max_age_s = open_replica_handoff(
        {"handoff": str(tmp_path / "h"), "handoff_key_file": str(key_file), "handoff_max_age_s": 5}
    )
    assert max_age_s == 5.0 and store.location == str(tmp_path / "h")
    ledger.record("replica without a hand-over key, or with a key file open to others", cases=2)


def test_a_killed_front_ends_hand_overs_are_swept_by_the_replica(tmp_path, monkeypatch, ledger):
    handoff = tmp_path / "handoff"
    monkeypatch.setenv("ADARAG_HANDOFF_KEY", KEY)
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_FRONT_END, str(handoff), KEY],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert killed.returncode == 137, killed.stderr[-2000:]
    left = list(handoff.iterdir())
    assert len(left) == 3
    max_age_s = 1.0
    store, _ = open_replica_handoff({"handoff": str(handoff), "handoff_max_age_s": max_age_s})
    live = HandoffBinding(uuid.uuid4().hex, prompt_digest([4, 5]), 2)
    sweeper = HandoffSweeper(store, max_age_s, interval_s=0.2).start()
    try:
        deadline = time.monotonic() + 10 * max_age_s
        while any(path.exists() for path in left) and time.monotonic() < deadline:
            store.write(live, FusedContext(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4)))
            time.sleep(0.1)  # a live request's hand-over, rewritten: never old enough to go
    finally:
        sweeper.stop()
    swept = sum(not path.exists() for path in left)
    ledger.record("hand-overs left by a killed front end", cases=3, detected=swept)
    assert swept == 3 and sweeper.num_removed >= 3
    assert store.check(live) is None  # the live one stays
