"""How a RAG prompt is laid out."""

from __future__ import annotations

from pydantic import Field, model_validator

from adarag.config.base import _Frozen

_RESERVED_PROMPT_CHARACTERS = ("\x00", "\x01", "\x02")  # the prompt builder's own markers


class PromptConfig(_Frozen):
    """How a RAG prompt is laid out: system prefix, chunks, query suffix."""

    system_prompt: str = Field(
        default="You are a helpful assistant. Answer the question using the passages. "
        "Reply with a short answer only.",
        description="System message of the chat template.",
    )
    context_intro: str = Field(
        default="Passages:\n", description="Text that opens the user turn, before the chunks."
    )
    chunk_separator: str = Field(
        default="\n\n", description="Appended to every chunk before it is tokenized on its own."
    )
    question_template: str = Field(
        default="Question: {question}",
        description="Text after the chunks; must contain '{question}'.",
    )
    enable_turn_reuse: bool = Field(
        default=True,
        description="Lay each earlier turn of a conversation out as a segment of its own after "
        "the chunks, cached and reused like a chunk, so a follow-up computes only the turn it "
        "adds and its question; off: the earlier turns are part of the query suffix and "
        "recomputed every turn.",
    )
    citations: bool = Field(
        default=False,
        description="Number the passages ([1], [2], ...) and ask the model to cite them; each "
        "number is a segment of its own before its chunk, so chunk KV is reused as without "
        "citations.",
    )
    citation_label: str = Field(
        default="[{number}] ",
        description="The label before each passage with citations; must contain '{number}'.",
    )
    citation_instruction: str = Field(
        default="Cite the passages you use by their numbers, e.g. [1].",
        description="Added after the question (in the query suffix) with citations.",
    )

    @model_validator(mode="after")
    def _check_template(self) -> PromptConfig:
        if "{question}" not in self.question_template:
            raise ValueError(
                f"question_template must contain '{{question}}', got {self.question_template!r}"
            )
        try:
            self.question_template.format(question="")
        except (KeyError, IndexError, ValueError, AttributeError) as err:
            raise ValueError(
                f"question_template may hold no placeholder but '{{question}}' (write '{{{{' and "
                f"'}}}}' for literal braces), got {self.question_template!r}"
            ) from err
        if "{number}" not in self.citation_label:
            raise ValueError(
                f"citation_label must contain '{{number}}', got {self.citation_label!r}"
            )
        names = (
            "system_prompt",
            "context_intro",
            "chunk_separator",
            "question_template",
            "citation_label",
            "citation_instruction",
        )
        for name in names:
            if any(char in getattr(self, name) for char in _RESERVED_PROMPT_CHARACTERS):
                raise ValueError(
                    f"{name} must not contain the characters \\x00 to \\x02 (reserved for the "
                    "prompt layout); remove them"
                )
        return self
