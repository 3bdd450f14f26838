"""The generator backends a pipeline starts, by ``engine.backend``, and the generator on them.

The engine loads its own torch backend; the others are built on the engine (``engine/vllm/``)
and are started from here, so the engine never imports them. Adding a backend is its package
plus one entry of :data:`BACKENDS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from adarag.config import EngineConfig, KernelConfig
from adarag.engine.adapter import DecoderAdapter
from adarag.engine.checkpoint import Checkpoint
from adarag.engine.decoding import Decoder
from adarag.engine.generator import Engine, StartBackend


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


def load_generator(engine: EngineConfig, kernels: KernelConfig, home: Path) -> Engine:
    """Load ``engine.model`` on ``engine.backend``, whichever backend it names.

    Raises:
        ModelLoadError: The checkpoint is missing or unsupported.
        MissingDependencyError: The vLLM backend is chosen but vLLM is not installed.
    """
    return Engine.load(engine, kernels, home, BACKENDS)
