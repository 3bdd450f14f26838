"""The few exception types adarag raises at its public boundaries."""

from __future__ import annotations


class AdaRagError(Exception):
    """Base class of every error adarag raises on purpose."""


class ConfigError(AdaRagError, ValueError):
    """A configuration value or a request argument is invalid."""


class InputError(AdaRagError, ValueError):
    """A request cannot be served as given (empty question, no chunks, prompt too long)."""


class ModelLoadError(AdaRagError, OSError):
    """A model path is missing, is not a checkpoint, or holds an unsupported model family."""


class CacheError(AdaRagError, OSError):
    """The KV cache directory cannot be used (not writable, held by another model)."""


class KnowledgeBaseError(AdaRagError, RuntimeError):
    """A knowledge base cannot be used: locked, empty, or built with another embedding model."""


class BackendError(AdaRagError, ConnectionError):
    """The model backend (a ``vllm serve`` replica) cannot be reached or failed a request."""


class KernelUnavailableError(AdaRagError, RuntimeError):
    """A kernel backend was requested explicitly but cannot run here."""


class MissingDependencyError(AdaRagError, ImportError):
    """An optional dependency is missing; the message names the extra that installs it."""

    def __init__(self, package: str, extra: str) -> None:
        super().__init__(
            f"{package} is not installed; install it with `pip install 'adarag[{extra}]'` "
            "(or run `make install`)."
        )
        self.package = package
        self.extra = extra
