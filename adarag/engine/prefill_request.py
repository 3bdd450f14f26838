"""What one prefill is asked for: the prompt, each segment's KV source, how tokens are chosen.

A :class:`PrefillRequest` is the one value :meth:`~adarag.engine.core.Engine.prefill` takes: the
laid-out prompt and where each segment's KV comes from, the answer's rows, the selection rule and
its levers, the profile's learned controls (:class:`LearnedControls`: the token scorer, the
routing ladder, the packet), what to collect beyond the KV and logits
(:class:`Collect`), and the oracle rules' inputs (:class:`OracleInputs`). The previous
augmentation step's KV to prefill into (:class:`ResidentKV`) is passed beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from adarag.config import RecomputeConfig
from adarag.engine.batch import SegmentSource
from adarag.engine.kv_cache import KVCache
from adarag.engine.packet import packet_ids, reuses_approximately
from adarag.engine.routing import RoutingLadder
from adarag.fitted import FittedModel
from adarag.schema import PromptLayout


@dataclass(frozen=True)
class LearnedControls:
    """What a fused prefill reads from the profile: the token scorer, the ladder, the packet.

    Attributes:
        token_scorer: The ``learned`` rule's fitted scorer; None: it scores as
            ``query_deviation``.
        ladder: The routing ladder (:mod:`~adarag.engine.routing`); None: no routing.
        packet: [bridge_tokens + trailer_tokens, hidden_size] the packet's embeddings
            (:mod:`~adarag.engine.packet`), the bridge's rows first, whose tokens the layout
            holds; None: no packet.
        bridge_tokens: Rows of the bridge.
        trailer_tokens: Rows of the trailer.
        packet_digest: The packet file's digest (entries made with a trailer are bound to it).
        bridge_replaces: The query suffix's opening ids the bridge stands in for; empty: the
            bridge is inserted before the query.
    """

    token_scorer: FittedModel | None = None
    ladder: RoutingLadder | None = None
    packet: torch.Tensor | None = None
    bridge_tokens: int = 0
    trailer_tokens: int = 0
    packet_digest: str | None = None
    bridge_replaces: tuple[int, ...] = ()

    def bridged(
        self, layout: PromptLayout, sources: Sequence[SegmentSource], vocab_size: int
    ) -> PromptLayout:
        """``layout`` with the bridge opening its query, when it has one and ``sources`` reuse.

        A prompt whose context is all its own (:func:`reuses_approximately` is False) stays as
        it is, so ratio 1.0 and hard-tier replays equal what they were without a packet. A
        bridge fitted in place of the query's opening tokens is used only where the query opens
        with them (another prompt template gets no bridge).
        """
        if not self.bridge_tokens or not reuses_approximately(sources):
            return layout
        replaces = self.bridge_replaces
        if replaces and layout.query_ids[: len(replaces)] != replaces:
            return layout
        return layout.with_bridge(packet_ids(vocab_size, self.bridge_tokens), len(replaces))

    def trailer_ids(self, vocab_size: int) -> tuple[int, ...]:
        """The ids every chunk ends with (the trailer's rows, after the bridge's); () if none."""
        ids = packet_ids(vocab_size, self.bridge_tokens + self.trailer_tokens)
        return ids[self.bridge_tokens :]


@dataclass(frozen=True)
class Collect:
    """What a prefill returns beyond the prompt's KV, logits and last-token residual stream.

    Attributes:
        num_lens_layers: Logit-lens layers (at most the model's; the last one is the logits).
        segment_attention: Segment-to-segment and token-to-segment attention mass (Cache-Craft's
            statistics, the profile builders).
        features: The candidates' raw run-time features (rules scoring at the check layer).
    """

    num_lens_layers: int = 1
    segment_attention: bool = False
    features: bool = False


@dataclass(frozen=True)
class OracleInputs:
    """The oracle selection rules' inputs (benchmark controls, never a user's request).

    Attributes:
        reference_kv: The ``oracle`` rule's full prefill of the same prompt.
        position_scores: The ``output_oracle`` rule's [num_tokens] scores.
    """

    reference_kv: KVCache | None = None
    position_scores: torch.Tensor | None = None


@dataclass(frozen=True)
class ResidentKV:
    """The previous augmentation step's KV cache, prefilled into when it has room.

    Attributes:
        kv: The cache.
        num_rows: Its leading rows holding this prompt's exact KV (at a segment boundary).
    """

    kv: KVCache
    num_rows: int


@dataclass(frozen=True)
class PrefillRequest:
    """One full or fused prefill of a laid-out prompt.

    Attributes:
        layout: The prompt's segments.
        sources: One per segment (system, chunks..., query); None computes everything.
        max_new_tokens: Tokens the answer may take (checked against the context, rows reserved).
        min_capacity: Rows for at least this many prompt tokens (a request's later steps).
        selection: How tokens of cached segments are chosen; the default rule when None.
        controls: The profile's learned controls.
        collect: What to return beyond the KV and logits.
        oracle: The oracle rules' inputs.
    """

    layout: PromptLayout
    sources: Sequence[SegmentSource] | None = None
    max_new_tokens: int = 0
    min_capacity: int = 0
    selection: RecomputeConfig | None = None
    controls: LearnedControls = field(default_factory=LearnedControls)
    collect: Collect = field(default_factory=Collect)
    oracle: OracleInputs = field(default_factory=OracleInputs)
