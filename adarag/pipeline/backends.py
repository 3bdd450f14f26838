"""The engine backends a pipeline starts, by ``engine.backend``, and the engine on them.

The engine loads its own torch backend; the others are built on the engine (``engine/vllm/``)
and are started from here, so the engine never imports them. Adding a backend is its package
plus one entry of :data:`BACKENDS`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Protocol, cast

from adarag.config import EngineConfig, KernelConfig
from adarag.engine.adapter import DecoderAdapter
from adarag.engine.checkpoint import Checkpoint
from adarag.engine.core import Engine, StartBackend
from adarag.engine.decoding import Decoder
from adarag.engine.gate import check_blending

logger = logging.getLogger(__name__)


def start_vllm(
    checkpoint: Checkpoint,
    engine: EngineConfig,
    max_context_tokens: int,
    eos_token_ids: frozenset[int],
) -> tuple[DecoderAdapter, Decoder]:
    """An in-process vLLM engine on ``checkpoint`` (vLLM is imported only here, when chosen).

    Raises:
        MissingDependencyError: vLLM is not installed.
    """
    from adarag.engine.vllm import start_vllm as start

    return start(checkpoint, engine, max_context_tokens, eos_token_ids)


def start_vllm_server(
    checkpoint: Checkpoint,
    engine: EngineConfig,
    max_context_tokens: int,
    eos_token_ids: frozenset[int],
) -> tuple[DecoderAdapter, Decoder]:
    """The torch engine fuses, ``vllm serve`` replicas decode (no vLLM import here).

    Raises:
        BackendError: A replica does not answer.
    """
    from adarag.engine.vllm.server_decoder import start_vllm_server as start

    return start(checkpoint, engine, max_context_tokens, eos_token_ids)


BACKENDS: Mapping[str, StartBackend] = MappingProxyType(
    {"vllm": start_vllm, "vllm-server": start_vllm_server}
)


def load_engine(engine: EngineConfig, kernels: KernelConfig, home: Path) -> Engine:
    """Load ``engine.model`` on ``engine.backend``, whichever backend it names.

    On a vLLM backend the blending gate runs first (``engine.blending_gate``): a model whose
    chunk-KV reuse is not exact is served without handing fused KV to vLLM.

    Raises:
        ModelLoadError: The checkpoint is missing or unsupported.
        MissingDependencyError: The vLLM backend is chosen but vLLM is not installed.
    """
    loaded = Engine.load(engine, kernels, home, BACKENDS)
    if engine.backend != "torch" and engine.blending_gate != "off":
        _gate(loaded, engine.blending_gate)
    return loaded


def _gate(engine: Engine, mode: str) -> None:
    """Run the blending gate on a vLLM backend; on failure refuse to blend (or only warn)."""
    try:
        report = check_blending(engine)
    except BaseException:
        engine.close()
        raise
    if report.passed:
        logger.info("blending gate passed for %s", report.model)
        return
    if mode == "warn":
        logger.warning("%s\nblending anyway (engine.blending_gate='warn')", report.summary())
        return
    logger.error(
        "%s\nrefusing to blend: vLLM computes every prompt itself (engine.blending_gate)",
        report.summary(),
    )
    cast(_RefusesBlending, engine.decoder).refuse_blending("; ".join(report.reasons))


class _RefusesBlending(Protocol):
    """A vLLM decoder: it can stop handing fused KV over and let vLLM compute every prompt."""

    def refuse_blending(self, reason: str) -> None: ...
