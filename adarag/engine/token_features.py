"""Run-time features of the reused tokens of a fused prefill, for the learned selector.

What the ``learned`` selection rule reads for every candidate token, all known before any
token is recomputed above the check layer (the same pass ``query_deviation`` makes):

- at the check layer: the squared deviation of the token's fresh V and K from its cached ones,
  and the squared norm of its cached V (InfoFlow KV weighs attention by it);
- the attention the query suffix pays the token in every layer (the query pass over the reused
  KV, summed over query tokens, averaged over heads), and the attention its last token pays it
  (the token that predicts the answer's first);
- where it stands: its offset in its chunk, the chunk's length, the chunk's order in the prompt
  (the retrieval rank) and how many chunks the prompt has.

These *raw* columns are what the engine computes (:func:`raw_token_features`). A fitted scorer
reads *derived* features named in its profile (:func:`derive_features`): logarithms, layer bands
of the query's attention, relative positions, and values centred on their chunk's mean. Fitting
and serving call the same function, so a profile's features mean the same thing in both.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import torch

RAW_COLUMNS = ("v_dev", "k_dev", "v_norm", "offset", "chunk_length", "chunk_index", "num_chunks")
"""The raw columns before the query's attention per layer (``q_mass_<layer>``, then
``last_mass_<layer>`` for its last token)."""

EPS = 1e-12
_BAND = re.compile(r"^log_(q|last)_mass:(\d+)-(\d+)$")


def raw_columns(num_layers: int) -> tuple[str, ...]:
    """Names of the raw feature columns of a model with ``num_layers`` layers."""
    return (
        RAW_COLUMNS
        + tuple(f"q_mass_{layer}" for layer in range(num_layers))
        + tuple(f"last_mass_{layer}" for layer in range(num_layers))
    )


def raw_token_features(
    *,
    fresh_k: torch.Tensor,
    fresh_v: torch.Tensor,
    cached_k: torch.Tensor,
    cached_v: torch.Tensor,
    query_layer_mass: torch.Tensor,
    positions: torch.Tensor,
    segment: torch.Tensor,
    offset: torch.Tensor,
    lengths: Sequence[int],
    num_chunks: int,
) -> torch.Tensor:
    """[n, len(raw_columns(L))] float32 on the CPU: the raw features of ``n`` candidates.

    Args:
        fresh_k: [n, num_kv_heads, head_dim] the candidates' fresh K at the check layer.
        fresh_v: [n, num_kv_heads, head_dim] their fresh V there.
        cached_k: [n, num_kv_heads, head_dim] their cached K there (re-rotated in place).
        cached_v: [n, num_kv_heads, head_dim] their cached V there.
        query_layer_mass: [2, L, num_tokens] the attention of the query's tokens ([0]) and of
            its last token ([1]) to each position, per layer.
        positions: [n] the candidates' positions.
        segment: [n] each candidate's segment index (1 is the first chunk).
        offset: [n] each candidate's offset inside its segment.
        lengths: Tokens per segment.
        num_chunks: Chunks in the prompt.
    """

    def squared(x: torch.Tensor) -> torch.Tensor:
        return x.float().pow(2).sum(dim=(1, 2)).cpu()

    segment = segment.cpu()
    columns = [
        squared(fresh_v - cached_v),
        squared(fresh_k - cached_k),
        squared(cached_v),
        offset.cpu().float(),
        torch.tensor(list(lengths), dtype=torch.float32)[segment],
        (segment - 1).float(),
        torch.full((positions.numel(),), float(num_chunks)),
    ]
    mass = query_layer_mass.float().cpu()[:, :, positions.cpu()]  # [2, L, n]
    return torch.cat((torch.stack(columns, dim=1), mass[0].T, mass[1].T), dim=1)


def derive_features(raw: np.ndarray, names: Sequence[str], num_layers: int) -> np.ndarray:
    """[n, len(names)] float64 derived features of the raw rows [n, len(raw_columns(L))].

    A name is a base feature, optionally suffixed ``@chunk`` (minus its mean over the token's
    chunk). Bases: ``log_v_dev``, ``log_k_dev``, ``log_v_norm``, ``log_q_mass`` (all layers),
    ``log_q_mass:a-b`` (layers ``a..b-1``), ``log_last_mass`` and ``log_last_mass:a-b`` (the
    query's last token only), ``log_query_deviation`` (``log_v_dev +
    log_q_mass``), ``rel_offset`` (offset / chunk length), ``log_offset``, ``chunk_start``
    (offset < 4), ``chunk_end`` (within the last 4 tokens), ``chunk_order`` (0 first, 1 last),
    ``log_chunk_length``.

    Raises:
        ValueError: A name is not one of these.
    """
    raw = np.asarray(raw, dtype=np.float64)
    column = {name: raw[:, idx] for idx, name in enumerate(raw_columns(num_layers))}
    column["mass"] = raw[:, len(RAW_COLUMNS) : len(RAW_COLUMNS) + num_layers]
    column["last_mass"] = raw[:, len(RAW_COLUMNS) + num_layers :]
    out = np.empty((raw.shape[0], len(names)))
    chunk = column["chunk_index"]
    for idx, name in enumerate(names):
        stem, _, suffix = name.partition("@")
        values = _base_feature(stem, column, num_layers)
        if suffix == "chunk":
            for value in np.unique(chunk):
                rows = chunk == value
                values[rows] -= values[rows].mean()
        elif suffix:
            raise ValueError(f"unknown token feature suffix @{suffix} in {name!r}")
        out[:, idx] = values
    return out


def _base_feature(name: str, column: dict[str, np.ndarray], num_layers: int) -> np.ndarray:
    """One base feature (see :func:`derive_features`) of the raw columns by name.

    ``column`` also holds ``mass`` and ``last_mass`` [n, num_layers], the query's attention.
    """
    mass, last_mass = column["mass"], column["last_mass"]
    band = _BAND.match(name)
    if band is not None:
        first, last = int(band.group(2)), int(band.group(3))
        if not 0 <= first < last <= num_layers:
            raise ValueError(f"{name}: not a layer band of a {num_layers}-layer model")
        rows = last_mass if band.group(1) == "last" else mass
        return np.log(rows[:, first:last].sum(axis=1) + EPS)
    offset, length = column["offset"], column["chunk_length"]
    table = {
        "log_v_dev": lambda: np.log(column["v_dev"] + EPS),
        "log_k_dev": lambda: np.log(column["k_dev"] + EPS),
        "log_v_norm": lambda: np.log(column["v_norm"] + EPS),
        "log_q_mass": lambda: np.log(mass.sum(axis=1) + EPS),
        "log_last_mass": lambda: np.log(last_mass.sum(axis=1) + EPS),
        "log_query_deviation": lambda: (
            np.log(column["v_dev"] + EPS) + np.log(mass.sum(axis=1) + EPS)
        ),
        "rel_offset": lambda: offset / np.maximum(length, 1.0),
        "log_offset": lambda: np.log1p(offset),
        "chunk_start": lambda: (offset < 4).astype(np.float64),
        "chunk_end": lambda: (offset >= length - 4).astype(np.float64),
        "chunk_order": lambda: column["chunk_index"] / np.maximum(column["num_chunks"] - 1, 1.0),
        "log_chunk_length": lambda: np.log(np.maximum(length, 1.0)),
    }
    if name not in table:
        raise ValueError(f"unknown token feature {name!r}")
    return table[name]()
