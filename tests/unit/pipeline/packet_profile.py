"""A model profile with a random packet, written into the pipeline's home as `calibrate` would."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import torch
from safetensors.torch import save

from adarag.pipeline import AdaRAG
from adarag.profiles import generic_profile
from adarag.profiles.packet import BRIDGE, TRAILER, PacketRecord, packet_file_name

ASKED = {"recompute": {"packet": "auto"}}
"""The ``cache`` override that asks for the profile's packet (off by default)."""


def with_packet(rag: AdaRAG, rows: int = 4, trailer: int = 0) -> bytes:
    """Give the model a profile with a random packet (bridge, trailer), as `calibrate` writes it."""
    hidden = rag.engine.spec.hidden_size
    parts = {BRIDGE: torch.randn(rows, hidden) * 0.5, TRAILER: torch.randn(trailer, hidden) * 0.5}
    data = save({name: part for name, part in parts.items() if part.shape[0]})
    record = PacketRecord(
        packet_file_name(rag.engine.checkpoint.name, data),
        hashlib.sha256(data).hexdigest(),
        rows,
        0.2,
        trailer_tokens=trailer,
    )
    engine = rag.engine
    profile = generic_profile(engine.checkpoint.name, engine.fingerprint, engine.spec.num_layers)
    directory = rag.config.home / "profiles"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / record.file).write_bytes(data)
    (directory / f"{engine.fingerprint}.json").write_text(replace(profile, packet=record).to_json())
    return data
