"""The packet a model's profile names: learned packet-token embeddings in a file beside it.

``adarag calibrate --packet`` fits the embeddings (:mod:`adarag.evaluation.profiling.packet_fit`)
and writes them as a safetensors file named by the digest of its bytes,
``<model>.packet-<digest[:12]>.safetensors``, beside the profile JSON; the profile keeps a
:class:`PacketRecord` with the full digest, so a table that does not match its profile is refused,
never used.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from typing import Any

from adarag.errors import ConfigError

BRIDGE = "bridge"
"""The tensor name of the bridge's rows: packet tokens between the context and the question."""
TRAILER = "trailer"
"""The tensor name of the trailer's rows: packet tokens after each chunk, stored with its KV."""


@dataclass(frozen=True)
class PacketRecord:
    """What the profile keeps of its packet.

    Attributes:
        file: The safetensors file's name, beside the profile.
        digest: SHA-256 of the file's bytes (hex).
        bridge_tokens: Rows of the bridge (0: none).
        ratio: The recomputation ratio of the reused chunks the packet was fitted at.
        num_questions: Calibration questions it was fitted on.
        epochs: Passes over them.
        loss_curve: Mean KL (nats per answer token) to full recomputation's distributions on
            the fitting questions: without a packet, with the starting rows, then each pass's
            mean while it trained.
        held_out_kl: The same on the held-out calibration questions: without, then with it.
        trailer_tokens: Rows of the trailer (0: none).
        bridge_replaces: The token ids opening the query suffix that the bridge stands in for
            (its rows started as their embeddings, so the unfitted bridge is the prompt as it
            was); empty: the bridge is inserted before the query.
    """

    file: str
    digest: str
    bridge_tokens: int
    ratio: float
    num_questions: int = 0
    epochs: int = 0
    loss_curve: tuple[float, ...] = ()
    held_out_kl: tuple[float, float] | None = None
    trailer_tokens: int = 0
    bridge_replaces: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "file": self.file,
            "digest": self.digest,
            "bridge_tokens": self.bridge_tokens,
            "ratio": self.ratio,
            "num_questions": self.num_questions,
            "epochs": self.epochs,
            "loss_curve": list(self.loss_curve),
            "held_out_kl": None if self.held_out_kl is None else list(self.held_out_kl),
            "trailer_tokens": self.trailer_tokens,
            "bridge_replaces": list(self.bridge_replaces),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PacketRecord:
        """Read :meth:`to_dict`'s output."""
        held_out = data.get("held_out_kl")
        return cls(
            file=str(data["file"]),
            digest=str(data["digest"]),
            bridge_tokens=int(data["bridge_tokens"]),
            ratio=float(data["ratio"]),
            num_questions=int(data.get("num_questions", 0)),
            epochs=int(data.get("epochs", 0)),
            loss_curve=tuple(float(x) for x in data.get("loss_curve", ())),
            held_out_kl=None if held_out is None else (float(held_out[0]), float(held_out[1])),
            trailer_tokens=int(data.get("trailer_tokens", 0)),
            bridge_replaces=tuple(int(x) for x in data.get("bridge_replaces", ())),
        )


def packet_file_name(model: str, data: bytes) -> str:
    """The name a packet file of ``data`` gets: the model's, versioned by the bytes' digest."""
    return f"{model}.packet-{hashlib.sha256(data).hexdigest()[:12]}.safetensors"


def read_packet(record: PacketRecord, folder: Traversable, source: str) -> bytes:
    """The packet file's bytes, checked against the record's digest.

    Raises:
        ConfigError: The file is missing, or its bytes are not the ones the profile was fitted
            with.
    """
    path = folder.joinpath(record.file)
    if not path.is_file():
        raise ConfigError(
            f"{source} names the packet file {record.file}, which is not beside it; copy the "
            "file there, or run `adarag calibrate --packet` again"
        )
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != record.digest:
        raise ConfigError(
            f"{record.file} does not hold the packet {source} was fitted with (its digest "
            "differs); restore the file, or run `adarag calibrate --packet` again"
        )
    return data
