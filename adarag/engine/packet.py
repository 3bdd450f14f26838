"""Packet tokens: learned embeddings a prompt carries as tokens of their own (KV Packet).

A packet token has no row in the model's vocabulary: it stands in a prompt as an id from
``vocab_size`` up, and the stream embeds it with a row of the request's packet table (the
``ForwardBatch.packet``) instead of the embedding matrix. The model's weights never change; the
table is fitted per model by ``adarag calibrate --packet`` (:mod:`adarag.evaluation.profiling.
packet_fit`), whose student is :func:`~adarag.engine.packet_student.tail_logits`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from adarag.engine.adapter import DecoderAdapter
from adarag.engine.batch import SegmentSource
from adarag.errors import InputError


def packet_ids(vocab_size: int, count: int) -> tuple[int, ...]:
    """The ids a prompt gives the rows ``0..count-1`` of its packet table."""
    return tuple(range(vocab_size, vocab_size + count))


def embed_tokens(
    model: DecoderAdapter, token_ids: torch.Tensor, packet: torch.Tensor | None
) -> torch.Tensor:
    """Embed ``token_ids [n]``; ids from ``vocab_size`` up take rows of ``packet [m, hidden]``.

    Raises:
        InputError: A packet id is in the prompt but no table (or too small a one) came with it.
    """
    vocab = model.spec.vocab_size
    is_packet = token_ids >= vocab
    if not bool(is_packet.any()):
        return model.embed(token_ids)
    rows = token_ids[is_packet] - vocab
    if packet is None or int(rows.max()) >= packet.shape[0]:
        held = 0 if packet is None else packet.shape[0]
        raise InputError(
            f"the prompt holds packet token {int(rows.max())} but its packet table has {held} "
            "rows; prefill packet tokens with the profile's packet (cache.recompute.packet)"
        )
    hidden = model.embed(token_ids.clamp(max=vocab - 1))
    table = packet.to(device=hidden.device, dtype=hidden.dtype)
    index = (token_ids - vocab).clamp(min=0)
    return torch.where(is_packet[:, None], table[index], hidden)


def reuses_approximately(sources: Sequence[SegmentSource]) -> bool:
    """Whether a prompt reuses KV that is not its own (the case a bridge is fitted for).

    A chunk reused from another context at a ratio below 1 is; the exact system prefix, hard
    hits and segments computed in full are not, so a prompt of only those never carries the
    bridge and equals full recomputation.
    """
    return any(
        source.cached is not None and not source.exact and source.recompute_ratio < 1.0
        for source in sources
    )
