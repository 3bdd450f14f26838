"""Cache-Craft's chunk variants: which stored variant of a chunk to reuse, and which to evict.

A *variant* is a chunk's KV computed after some prefix of other chunks, stored with what
Cache-Craft (section 3) keeps beside it: the prefix (chunk keys in order), the inter-chunk
attention ``inter(c_j, c)`` from each prefix chunk, the cache context impact CCI, and its tokens
ranked by how much attention they paid to the prefix. For a new prompt whose chunks before ``c``
are ``S_new``:

- prefix overlap ``β = Σ_{j ∈ S_old ∩ S_new} inter(j) / Σ_{j ∈ S_old} inter(j)`` (Eq. 6);
- order penalty ``γ``: normalised Kendall-tau distance of the shared chunks' orders (Eq. 7);
- ``β' = β · (1 − γ)`` (Eq. 8);
- ``CCI = sigmoid(ā / b̄)`` with ``a^l = Σ_j inter^l(j) / (|c| |c_j|)``, ``b^l = intra^l / |c|²``
  (Eqs. 9-11);
- cache-fix overhead ``CFO = α · CCI · (1 − β')`` (Eq. 12), clipped to [0, 1]: the share of the
  chunk's tokens to recompute, the best-ranked ones first (Eq. 14).

The variant with the lowest CFO is reused; each reuse adds ``1 / CFO`` to its
frequency-reusability score ``f_r``, and when the N x M budget is full the variant with the lowest
``f_r`` is evicted. A variant with no prefix (its chunk came first) has β = 1 for a prompt where
the chunk comes first too (it is then exact) and β = 0 elsewhere (nothing of the new prefix is in
it), where the paper's ratio is 0 / 0.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from adarag.cache.state_lock import StateLock
from adarag.config import VariantConfig

MIN_CFO = 0.01
"""Floor of the CFO in the ``f_r += 1 / CFO`` update (an exact reuse has CFO 0)."""


@dataclass(frozen=True)
class VariantStats:
    """What Cache-Craft stores with a variant, measured when its chunk was computed in full.

    Attributes:
        inter: ``inter(c_j, c)`` per prefix chunk, in prefix order: attention mass the chunk's
            tokens paid to that chunk, summed over the tokens, mean over heads and layers.
        cci: Cache context impact, in [0.5, 1).
        ranking: Token indices of the chunk, the most contextualised first.
    """

    inter: tuple[float, ...]
    cci: float
    ranking: tuple[int, ...]


@dataclass(eq=False)
class Variant:
    """One stored variant of a chunk.

    Attributes:
        key: The store key of its KV.
        chunk: The chunk's content key.
        prefix: Content keys of the chunks before it when it was computed, in order.
        stats: Its attention statistics.
        frequency_reusability: ``f_r``, the eviction score.
        serial: Insertion order (older variants go first on equal ``f_r``).
    """

    key: str
    chunk: str
    prefix: tuple[str, ...]
    stats: VariantStats
    frequency_reusability: float = 0.0
    serial: int = 0


def prefix_overlap(
    prefix: Sequence[str], inter: Sequence[float], new_prefix: Sequence[str]
) -> float:
    """β: the share of the variant's inter-chunk attention whose chunks are in ``new_prefix``."""
    if not prefix:
        return 1.0 if not new_prefix else 0.0
    present = set(new_prefix)
    total = sum(inter)
    if total <= 0.0:  # no attention measured: the share of the chunks instead
        return sum(1 for key in prefix if key in present) / len(prefix)
    return sum(mass for key, mass in zip(prefix, inter, strict=True) if key in present) / total


def order_penalty(prefix: Sequence[str], new_prefix: Sequence[str]) -> float:
    """γ: discordant pairs over all pairs of the chunks both prefixes hold (0 with fewer than 2)."""
    new_rank = {key: idx for idx, key in reversed(list(enumerate(new_prefix)))}
    shared = list(dict.fromkeys(key for key in prefix if key in new_rank))  # old order
    if len(shared) < 2:
        return 0.0
    pairs = list(itertools.combinations(shared, 2))
    discordant = sum(1 for first, second in pairs if new_rank[first] > new_rank[second])
    return discordant / len(pairs)


def cache_fix_overhead(variant: Variant, new_prefix: Sequence[str], alpha: float) -> float:
    """CFO = α · CCI · (1 − β · (1 − γ)), clipped to [0, 1]."""
    stats = variant.stats
    beta = prefix_overlap(variant.prefix, stats.inter, new_prefix)
    adjusted = beta * (1.0 - order_penalty(variant.prefix, new_prefix))
    return min(1.0, max(0.0, alpha * stats.cci * (1.0 - adjusted)))


def variant_stats(
    token_mass: torch.Tensor, chunk_segment: int, segment_lengths: Sequence[int]
) -> VariantStats:
    """A variant's statistics from its chunk's attention in the prefill that computed it.

    Args:
        token_mass: [num_layers, num_chunk_tokens, num_segments] attention probability mass of
            each of the chunk's tokens onto each prompt segment, mean over heads. Segment 0 is
            the system prefix, segments ``1..chunk_segment - 1`` the chunks before it.
        chunk_segment: The chunk's segment index.
        segment_lengths: Tokens of every segment.

    Returns:
        inter per prefix chunk, CCI and the token ranking.
    """
    mass = token_mass.float()
    num_tokens = mass.shape[1]
    assert num_tokens == segment_lengths[chunk_segment], "one row per token of the chunk"
    prefix = slice(1, chunk_segment)
    inter_per_layer = mass[:, :, prefix].sum(dim=1)  # [num_layers, num_prefix_chunks]
    intra_per_layer = mass[:, :, chunk_segment].sum(dim=1)  # [num_layers]
    prefix_lengths = torch.tensor(segment_lengths[prefix], dtype=torch.float32)
    a = (inter_per_layer / (num_tokens * prefix_lengths)).sum(dim=1).mean()
    b = (intra_per_layer / num_tokens**2).mean()
    ratio = float(a / b) if float(b) > 0.0 else (math.inf if float(a) > 0.0 else 0.0)
    cci = 1.0 / (1.0 + math.exp(-ratio)) if ratio != math.inf else 1.0
    per_token = mass[:, :, prefix].sum(dim=(0, 2))  # [num_tokens]
    ranking = torch.sort(-per_token, stable=True).indices
    inter = inter_per_layer.mean(dim=0)
    return VariantStats(tuple(float(x) for x in inter), cci, tuple(int(i) for i in ranking))


@dataclass
class VariantIndex:
    """The variants of every chunk within the N x M budget (Cache-Craft's metadata store).

    A chunk may hold any share of the budget (the paper's allocation is flexible). Pipelines
    over one store share the index: each method holds its lock (a leaf) while it runs.
    """

    config: VariantConfig
    by_chunk: dict[str, list[Variant]] = field(default_factory=dict)
    _serial: int = 0
    lock: StateLock = field(
        default_factory=lambda: StateLock("the variant index"), repr=False, compare=False
    )

    @property
    def num_variants(self) -> int:
        """Variants stored."""
        return sum(len(variants) for variants in self.by_chunk.values())

    def best(self, chunk: str, new_prefix: Sequence[str]) -> tuple[Variant, float] | None:
        """The chunk's variant with the lowest CFO for ``new_prefix`` and that CFO, or None.

        Equal CFOs go to the older variant. The choice counts as a use (``f_r += 1 / CFO``).
        """
        with self.lock:
            variants = self.by_chunk.get(chunk)
            if not variants:
                return None
            alpha = self.config.alpha
            scored = [(cache_fix_overhead(v, new_prefix, alpha), v.serial, v) for v in variants]
            cfo, _, chosen = min(scored, key=lambda item: (item[0], item[1]))
            chosen.frequency_reusability += 1.0 / max(cfo, MIN_CFO)
            return chosen, cfo

    def add(self, variant: Variant) -> list[Variant]:
        """Store ``variant`` (replacing one of the same key); returns the variants evicted.

        While the budget is exceeded the variant with the lowest ``f_r`` (then the oldest) is
        evicted; the new one is never its own victim.
        """
        with self.lock:
            variants = self.by_chunk.setdefault(variant.chunk, [])
            for idx, old in enumerate(variants):
                if old.key == variant.key:
                    variant.frequency_reusability = old.frequency_reusability
                    del variants[idx]
                    break
            self._serial += 1
            variant.serial = self._serial
            variants.append(variant)
            evicted = []
            while self.num_variants > self.config.max_variants:
                others = [v for vs in self.by_chunk.values() for v in vs if v is not variant]
                victim = min(others, key=lambda v: (v.frequency_reusability, v.serial))
                self.remove(victim)
                evicted.append(victim)
            return evicted

    def remove(self, variant: Variant) -> None:
        """Forget ``variant`` (no-op when another thread forgot it first)."""
        with self.lock:
            variants = self.by_chunk.get(variant.chunk, [])
            if variant not in variants:
                return
            variants.remove(variant)
            if not variants:
                del self.by_chunk[variant.chunk]
