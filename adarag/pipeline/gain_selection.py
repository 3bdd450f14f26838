"""The ``gain`` stop rule: a request's chunks chosen by information gain before any prefill.

Each chunk of the request's context (as arranged and fitted) is scored from its cached KV: the
question's next-token distribution after the system prefix alone and after the system prefix
and that chunk, all in one batched pass over the question's tokens
(:meth:`~adarag.engine.core.Engine.query_over_contexts`); a chunk the store lacks is computed
and stored first. The chunks whose gain reaches τ are kept (:func:`~adarag.augment.gain.
kept_chunks`) and the answer is prefilled from them alone, laid out again so that fitting and
citations follow the kept chunks.

τ is ``experimental.augment.gain_threshold``, else the profile's fitted one (``adarag calibrate
--depth --gain-records``), else IGP's hand-made 0.05 (:func:`gain_notes`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from adarag.augment.gain import DEFAULT_THRESHOLD, information_gain, kept_chunks
from adarag.config import AdaRagConfig, AugmentLevers
from adarag.engine.context_pass import each_chunk_alone
from adarag.pipeline.resources import Resources
from adarag.profiles import ModelProfile
from adarag.schema import Chunk, PromptLayout


@dataclass(frozen=True)
class GainSelection:
    """The chunks a request keeps by information gain.

    Attributes:
        chunks: The kept chunks, in the order they are listed (``gain_order``).
        gains: Each scored chunk's gain, in the order they were scored.
        gain_s: Seconds the scoring took (chunk KV computed when absent included).
    """

    chunks: tuple[Chunk, ...]
    gains: tuple[float, ...]
    gain_s: float


def selects_by_gain(config: AdaRagConfig) -> bool:
    """Whether a request's chunks are chosen by information gain before its prefill."""
    return config.augment.enabled and config.augment.stop_rule == "gain"


def gain_threshold(levers: AugmentLevers, profile: ModelProfile) -> float:
    """τ: the config's, else the profile's fitted one, else IGP's hand-made one."""
    if levers.gain_threshold is not None:
        return levers.gain_threshold
    if profile.gain is not None:
        return profile.gain.threshold
    return DEFAULT_THRESHOLD


def gain_notes(levers: AugmentLevers, profile: ModelProfile) -> list[str]:
    """What the gain rule's settings depart from for ``profile``'s model, to log once.

    The hand-made τ when the profile has none; else, using the profile's τ, an order or a top-K
    other than those it was chosen for.
    """
    fitted = profile.gain
    if levers.gain_threshold is None and fitted is None:
        return [
            f"no gain threshold calibrated for {profile.model}; keeping chunks whose information "
            f"gain reaches IGP's τ={DEFAULT_THRESHOLD} (run `adarag calibrate --depth "
            "--gain-records DIR` to fit one)"
        ]
    if levers.gain_threshold is not None or fitted is None:
        return []
    notes = []
    if fitted.order != levers.gain_order:
        notes.append(
            f"the profile's gain τ={fitted.threshold:g} was chosen for {fitted.order} order; "
            f"experimental.augment.gain_order is {levers.gain_order!r}"
        )
    if fitted.top_k != levers.gain_top_k:
        notes.append(
            f"the profile's gain τ={fitted.threshold:g} was chosen over the top-{fitted.top_k} "
            f"entropy; experimental.augment.gain_top_k is {levers.gain_top_k}"
        )
    return notes


def chunk_gains(resources: Resources, layout: PromptLayout, top_k: int) -> list[float]:
    """Each chunk of ``layout``'s gain, scored from its independent KV in one batched pass.

    Row 0 of the pass is the question after the system prefix alone; row i after the system
    prefix and chunk i (its independent KV from the store, computed and stored when absent).
    """
    system_kv = resources.system_kv()
    chunk_kvs = [resources.independent_kv(ids) for ids in layout.chunk_ids]
    with resources.engine_lock:
        passed = resources.engine.query_over_contexts(
            layout.query_ids, each_chunk_alone(system_kv, chunk_kvs)
        )
        logits = passed.logits.cpu().numpy()
    return information_gain(logits, top_k)


def select_by_gain(
    resources: Resources, layout: PromptLayout, chunks: tuple[Chunk, ...] | list[Chunk]
) -> GainSelection:
    """The chunks of ``layout`` (``chunks``, in its order) whose gain reaches τ.

    At least ``experimental.augment.min_chunks`` (1 when unset) are kept, the best gains
    first when fewer reach τ.
    """
    assert len(chunks) == len(layout.chunk_ids), "one chunk per chunk segment"
    levers = resources.config.experimental.augment
    started = time.perf_counter()
    gains = chunk_gains(resources, layout, levers.gain_top_k)
    threshold = gain_threshold(levers, resources.profile)
    kept = kept_chunks(
        gains, threshold, levers.gain_order, levers.min_chunks or 1, max_chunks=len(chunks)
    )
    return GainSelection(
        tuple(chunks[idx] for idx in kept), tuple(gains), time.perf_counter() - started
    )
