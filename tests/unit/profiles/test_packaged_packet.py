"""The packet the packaged SmolLM2 profile ships: found, intact, the replacing bridge it names."""

from __future__ import annotations

import hashlib
from importlib import resources

from safetensors.torch import load

from adarag.profiles import find_profile
from adarag.profiles.packet import BRIDGE


def test_the_packaged_smollm2_profile_ships_an_intact_replacing_bridge():
    found = find_profile("SmolLM2-135M-Instruct", "no-such-fingerprint", 30, [])
    assert found is not None and found.packet is not None and found.packet_bytes is not None
    record = found.packet
    shipped = (resources.files("adarag.profiles") / record.file).read_bytes()
    assert (
        hashlib.sha256(shipped).hexdigest()
        == record.digest
        == hashlib.sha256(found.packet_bytes).hexdigest()
    )
    rows = load(shipped)
    assert set(rows) == {BRIDGE} and rows[BRIDGE].shape == (record.bridge_tokens, 576)
    # it stands in for the query template's opening ids, one row each, and was fitted held out
    assert len(record.bridge_replaces) == record.bridge_tokens
    without, with_packet = record.held_out_kl
    assert with_packet < without
