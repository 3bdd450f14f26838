"""Prompt assembly from token segments, with the model's chat template around them.

The chat template is rendered once with a marker where the chunks go; the text before the marker
is the system prefix, the text after it (with the question) is the query suffix. Each chunk is
tokenized on its own with a fixed separator, so its ids -- and its cache key -- never depend on
its neighbours.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from adarag.config import PromptConfig
from adarag.errors import InputError, MissingDependencyError
from adarag.schema import PromptLayout

_CHUNKS_MARKER = "\x00ADARAG_CHUNKS\x00"

Turn = tuple[str, str]
"""An earlier turn of a conversation: (the user's message, the answer)."""
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def load_tokenizer(path: Path) -> Any:
    """The Hugging Face fast tokenizer saved in a checkpoint directory."""
    try:
        from transformers import AutoTokenizer
    except ImportError as err:
        raise MissingDependencyError("transformers", "all") from err
    return AutoTokenizer.from_pretrained(path)


class PromptBuilder:
    """Turns a question and chunk texts into a :class:`PromptLayout`."""

    def __init__(self, tokenizer: Any, config: PromptConfig) -> None:
        self.tokenizer = tokenizer
        self.config = config

    @cached_property
    def _template_halves(self) -> tuple[str, str]:
        """(text before the chunks, text after the question) of the rendered chat template."""
        user_content = self.config.context_intro + _CHUNKS_MARKER
        if getattr(self.tokenizer, "chat_template", None):
            messages = [
                {"role": "system", "content": self.config.system_prompt},
                {"role": "user", "content": user_content + "\x01"},
            ]
            rendered = self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
        else:
            rendered = f"{self.config.system_prompt}\n\n{user_content}\x01\nAnswer:"
        head, tail = rendered.split(_CHUNKS_MARKER)
        return head, tail.split("\x01", 1)[1]

    @cached_property
    def system_ids(self) -> tuple[int, ...]:
        """Token ids of the system prefix (template head, system prompt, context intro)."""
        return self._encode(self._template_halves[0])

    def chunk_ids(self, text: str) -> tuple[int, ...]:
        """Token ids of one chunk with its separator, tokenized alone.

        Raises:
            InputError: The text is not a string or holds a lone surrogate.
        """
        check_text(text, "the chunk")
        return self._encode(text + self.config.chunk_separator)

    def query_ids(
        self, question: str, history: Sequence[Turn] = (), note: str = ""
    ) -> tuple[int, ...]:
        """Token ids of the question and the template tail (assistant turn start).

        With ``history``, the earlier turns come first as chat turns of their own: the first
        user turn holds the context and the first earlier question, then each earlier answer as
        an assistant turn and each later question as a user turn. The system prefix and the
        chunks are the same as without history, so their KV is reused across turns. ``note``
        (e.g. the order hint) goes right before the question, after the chunks and earlier turns.

        Raises:
            InputError: The question or a turn is not a string or holds a lone surrogate.
        """
        check_text(question, "the question")
        check_text(note, "the note")
        if not history:
            text = note + self.config.question_template.format(question=question)
            return self._encode(text + self._template_halves[1])
        for idx, (asked, answered) in enumerate(history):
            check_text(asked, f"turn {idx}'s question")
            check_text(answered, f"turn {idx}'s answer")
        return self._encode(self._render_after_chunks([*history, (question, None)], note))

    def text_ids(self, text: str) -> tuple[int, ...]:
        """Token ids of text already in the model's format (no template added).

        Raises:
            InputError: The text is not a string or holds a lone surrogate.
        """
        check_text(text, "the prompt")
        return self._encode(text)

    def chat_ids(self, messages: Sequence[Mapping[str, str]]) -> tuple[int, ...]:
        """Token ids of chat messages in the model's chat template, ending at the assistant turn.

        Raises:
            InputError: There are no messages, or a message lacks a role or content.
        """
        if not messages:
            raise InputError("no messages given; pass at least one chat message")
        for idx, message in enumerate(messages):
            if not isinstance(message.get("role"), str) or not isinstance(
                message.get("content"), str
            ):
                raise InputError(f"message {idx} needs a string 'role' and 'content'")
            check_text(message["role"], f"message {idx}'s role")
            check_text(message["content"], f"message {idx}'s content")
        if getattr(self.tokenizer, "chat_template", None):
            rendered = self.tokenizer.apply_chat_template(
                [dict(message) for message in messages], tokenize=False, add_generation_prompt=True
            )
        else:
            lines = [f"{message['role']}: {message['content']}" for message in messages]
            rendered = "\n".join([*lines, "assistant:"])
        return self._encode(rendered)

    def layout(
        self, question: str, chunks: Sequence[str], history: Sequence[Turn] = (), note: str = ""
    ) -> PromptLayout:
        """Lay out a RAG prompt (``history``: earlier turns, see :meth:`query_ids`).

        Raises:
            InputError: The question is empty, there are no chunks, a chunk is empty, or a text
                is not a string or holds a lone surrogate.
        """
        check_text(question, "the question")
        if not question.strip():
            raise InputError("the question is empty; pass a non-empty question")
        if not chunks:
            raise InputError("no chunks given; pass at least one chunk of context")
        for idx, text in enumerate(chunks):
            check_text(text, f"chunk {idx}")
            if not text.strip():
                raise InputError(f"chunk {idx} is empty; drop it or pass its text")
        return PromptLayout(
            self.system_ids,
            tuple(self.chunk_ids(text) for text in chunks),
            self.query_ids(question, history, note),
        )

    def messages(
        self, question: str, chunks: Sequence[str], history: Sequence[Turn] = (), note: str = ""
    ) -> list[dict[str, str]]:
        """The prompt as chat messages (``role``, ``content``), for tracing and display.

        The turns :meth:`layout` lays out: the system prompt, then the context (the context
        intro and each chunk with its separator) opening the first user turn, earlier turns, and
        the question.
        """
        separator = self.config.chunk_separator
        context = self.config.context_intro + "".join(text + separator for text in chunks)
        return self._turn_messages([*history, (question, None)], context, note)

    def _turn_messages(
        self, turns: Sequence[tuple[str, str | None]], context: str, note: str = ""
    ) -> list[dict[str, str]]:
        """System message, then each turn; ``context`` opens the first, ``note`` the last."""
        config = self.config
        messages = [{"role": "system", "content": config.system_prompt}]
        for idx, (asked, answered) in enumerate(turns):
            text = config.question_template.format(question=asked)
            if idx == len(turns) - 1:
                text = note + text
            messages.append({"role": "user", "content": (context if idx == 0 else "") + text})
            if answered is not None:
                messages.append({"role": "assistant", "content": answered})
        return messages

    def _render_after_chunks(self, turns: Sequence[tuple[str, str | None]], note: str) -> str:
        """The prompt text after the chunks for ``turns`` (the last one unanswered)."""
        config = self.config
        if not getattr(self.tokenizer, "chat_template", None):
            return "\n".join(
                ("" if answered is not None else note)
                + f"{config.question_template.format(question=asked)}\nAnswer:"
                + ("" if answered is None else f" {answered}")
                for asked, answered in turns
            )
        messages = self._turn_messages(turns, config.context_intro + _CHUNKS_MARKER, note)
        rendered = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        head, tail = rendered.split(_CHUNKS_MARKER)
        if head != self._template_halves[0]:
            raise InputError(
                "this model's chat template renders the system prefix differently when earlier "
                "turns follow, so they cannot be carried as turns; pass the conversation "
                "without history"
            )
        return tail

    def _encode(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer.encode(text, add_special_tokens=False))


def retrieval_query(question: str, history: Sequence[Turn] = ()) -> str:
    """What a conversation's question is retrieved with: the earlier questions, then this one."""
    return "\n".join([*(asked for asked, _ in history), question])


def check_text(text: object, what: str) -> None:
    """Raise :class:`InputError` unless ``text`` is a string the tokenizer can encode.

    Raises:
        InputError: ``text`` is not a string, or holds a lone UTF-16 surrogate (U+D800 to
            U+DFFF, e.g. from a bad JSON escape or ``errors="surrogateescape"``),
            which is not valid Unicode and cannot be tokenized.
    """
    if not isinstance(text, str):
        raise InputError(f"{what} must be a string, got {type(text).__name__}; pass text")
    found = _LONE_SURROGATE.search(text)
    if found is not None:
        raise InputError(
            f"{what} holds a lone surrogate U+{ord(found.group()):04X} at character "
            f"{found.start()}, which is not valid Unicode; remove it or decode the input with "
            "errors='replace'"
        )
