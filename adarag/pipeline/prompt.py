"""Prompt assembly from token segments, with the model's chat template around them.

The chat template is rendered once with a marker where the chunks go; the text before the marker
is the system prefix, the text after it (with the question) is the query suffix. Each chunk is
tokenized on its own with a fixed separator, so its ids -- and its cache key -- never depend on
its neighbours.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

from adarag.config import PromptConfig
from adarag.errors import InputError, MissingDependencyError
from adarag.schema import PromptLayout

_CHUNKS_MARKER = "\x00ADARAG_CHUNKS\x00"
_TURN_MARKER = "\x02"  # where an earlier turn ends and the next one starts
CITATION_KEY = "citation_number"
"""Metadata key of a source's citation number (1-based) in an answer with citations."""
_CITATION = re.compile(r"\[(\d{1,4})\]")

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


CHUNK_IDS_CACHED = 4096
"""Chunk texts whose token ids a prompt builder keeps (least recently used dropped first)."""


class PromptBuilder:
    """Turns a question and chunk texts into a :class:`PromptLayout`."""

    def __init__(self, tokenizer: Any, config: PromptConfig) -> None:
        self.tokenizer = tokenizer
        self.config = config
        # a chunk is tokenized once, however many requests (and arrangement lookups) list it
        self._encode_chunk = lru_cache(maxsize=CHUNK_IDS_CACHED)(self._encode)

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
        return self._encode_chunk(text + self.config.chunk_separator)

    def chunk_label_ids(self, number: int) -> tuple[int, ...]:
        """Token ids of the citation label of passage ``number`` (1-based), e.g. ``[1] ``."""
        return self._encode(self.config.citation_label.replace("{number}", str(number)))

    def query_segments(
        self, question: str, history: Sequence[Turn] = (), note: str = ""
    ) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
        """The earlier turns as segments of their own, and the query suffix.

        With ``prompt.enable_turn_reuse`` each earlier turn is one segment (its question, its
        answer and the next turn's start), cut at the same places in every later prompt, so its
        ids -- and its cache key -- stay the same from turn to turn; the query suffix holds only
        the new question. Without it, the turns are part of the query suffix
        (:meth:`query_ids`). With ``prompt.citations`` the question carries the citation
        instruction; ``note`` (e.g. the order hint) goes right before the question.

        Raises:
            InputError: The question or a turn is not a string, holds a lone surrogate or the
                reserved character U+0002.
        """
        question = self._cited(question)
        if not history or not self.config.enable_turn_reuse:
            return (), self.query_ids(question, history, note)
        check_text(question, "the question")
        check_text(note, "the note")
        for idx, (asked, answered) in enumerate(history):
            check_text(asked, f"turn {idx}'s question")
            check_text(answered, f"turn {idx}'s answer")
        for idx, text in enumerate([question, *(t for turn in history for t in turn)]):
            if _TURN_MARKER in text:
                raise InputError(
                    f"text {idx} of the conversation holds the control character U+0002, which "
                    "the prompt layout reserves; remove it"
                )
        turns = [*history, (question, None)]
        pieces = self._render_after_chunks(turns, note, mark_turns=True).split(_TURN_MARKER)
        assert len(pieces) == len(history) + 1, f"{len(pieces)} pieces for {len(history)} turns"
        return tuple(self._encode(piece) for piece in pieces[:-1]), self._encode(pieces[-1])

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

    def chat_ids(
        self, messages: Sequence[Mapping[str, str]], *, add_default_system: bool = True
    ) -> tuple[int, ...]:
        """Token ids of chat messages in the model's chat template, ending at the assistant turn.

        Args:
            messages: ``{"role", "content"}`` dicts.
            add_default_system: Whether a list without a system message gets the default system
                prompt the template inserts (as the model is prompted); False renders the
                messages as given, so token counts of lists add up.

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
            rendered = self._render_chat(messages, add_generation_prompt=True)
            if not add_default_system and messages[0]["role"] != "system":
                rendered = self._render_without_default_system(messages, rendered)
        else:
            lines = [f"{message['role']}: {message['content']}" for message in messages]
            rendered = "\n".join([*lines, "assistant:"])
        return self._encode(rendered)

    def _render_chat(
        self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool
    ) -> str:
        return str(
            self.tokenizer.apply_chat_template(
                [dict(message) for message in messages],
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
            )
        )

    def _render_without_default_system(
        self, messages: Sequence[Mapping[str, str]], rendered: str
    ) -> str:
        """``messages`` rendered without the system prompt the template adds to a list lacking one.

        An empty system message stops the template from adding its own; what it renders is then
        cut off the front. A template that renders it elsewhere keeps ``rendered``.
        """
        blank = [{"role": "system", "content": ""}]
        head = self._render_chat(blank, add_generation_prompt=False)
        with_blank = self._render_chat([*blank, *messages], add_generation_prompt=True)
        return with_blank[len(head) :] if with_blank.startswith(head) else rendered

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
        history_ids, query_ids = self.query_segments(question, history, note)
        return PromptLayout(
            self.system_ids,
            tuple(self.chunk_ids(text) for text in chunks),
            query_ids,
            history_ids,
            self.chunk_labels(len(chunks)),
        )

    def chunk_labels(self, num_chunks: int) -> tuple[tuple[int, ...], ...]:
        """The citation labels of ``num_chunks`` passages; none without citations."""
        if not self.config.citations:
            return ()
        return tuple(self.chunk_label_ids(idx + 1) for idx in range(num_chunks))

    def messages(
        self, question: str, chunks: Sequence[str], history: Sequence[Turn] = (), note: str = ""
    ) -> list[dict[str, str]]:
        """The prompt as chat messages (``role``, ``content``), for tracing and display.

        The turns :meth:`layout` lays out: the system prompt, then the context (the context
        intro and each chunk with its separator) opening the first user turn, earlier turns, and
        the question.
        """
        config = self.config
        labels = [
            config.citation_label.replace("{number}", str(idx + 1)) if config.citations else ""
            for idx in range(len(chunks))
        ]
        context = config.context_intro + "".join(
            label + text + config.chunk_separator
            for label, text in zip(labels, chunks, strict=True)
        )
        return self._turn_messages([*history, (self._cited(question), None)], context, note)

    def _cited(self, question: str) -> str:
        """The question with the citation instruction after it, with citations."""
        if not self.config.citations or not isinstance(question, str):
            return question
        return f"{question}\n{self.config.citation_instruction}"

    def _turn_messages(
        self,
        turns: Sequence[tuple[str, str | None]],
        context: str,
        note: str = "",
        mark_turns: bool = False,
    ) -> list[dict[str, str]]:
        """System message, then each turn; ``context`` opens the first, ``note`` the last.

        ``mark_turns`` puts the turn marker where each later turn's text starts.
        """
        config = self.config
        messages = [{"role": "system", "content": config.system_prompt}]
        for idx, (asked, answered) in enumerate(turns):
            text = config.question_template.format(question=asked)
            if idx == len(turns) - 1:
                text = note + text
            opening = context if idx == 0 else (_TURN_MARKER if mark_turns else "")
            messages.append({"role": "user", "content": opening + text})
            if answered is not None:
                messages.append({"role": "assistant", "content": answered})
        return messages

    def _render_after_chunks(
        self, turns: Sequence[tuple[str, str | None]], note: str = "", mark_turns: bool = False
    ) -> str:
        """The prompt text after the chunks for ``turns`` (the last one unanswered).

        ``note`` goes before the last question; ``mark_turns`` puts the turn marker where each
        turn after the first starts.
        """
        config = self.config
        if not getattr(self.tokenizer, "chat_template", None):
            return ("\n" + (_TURN_MARKER if mark_turns else "")).join(
                ("" if answered is not None else note)
                + f"{config.question_template.format(question=asked)}\nAnswer:"
                + ("" if answered is None else f" {answered}")
                for asked, answered in turns
            )
        context = config.context_intro + _CHUNKS_MARKER
        messages = self._turn_messages(turns, context, note, mark_turns)
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


def condense_prompt(template: str, question: str, history: Sequence[Turn]) -> str:
    """The prompt asking the model to rewrite ``question`` after ``history`` as a standalone one.

    ``template`` holds ``{chat_history}`` (Human/Assistant lines) and ``{question}``.
    """
    lines = [f"Human: {asked}\nAssistant: {answered}" for asked, answered in history]
    return template.replace("{chat_history}", "\n".join(lines)).replace("{question}", question)


def cited_numbers(text: str) -> list[int]:
    """The passage numbers an answer cites (``[2]`` gives 2), in order of first citation."""
    return list(dict.fromkeys(int(found) for found in _CITATION.findall(text)))


def retrieval_query(
    question: str, history: Sequence[Turn] = (), *, with_answers: bool = False
) -> str:
    """What a conversation's question is retrieved with: the earlier questions, then this one.

    With ``with_answers`` the earlier answers follow (newest first), so a follow-up such as
    "Where was she born?" after the answer "Marta Kowalski." is retrieved with the name. The
    questions come first: an embedding model that truncates long texts cuts answers, not them.
    """
    answers = [answered for _, answered in reversed(history) if answered.strip()]
    return "\n".join(
        [*(asked for asked, _ in history), question, *(answers if with_answers else [])]
    )


def check_instruction(instruction: str) -> None:
    """Refuse an instruction (a chat's system message) the prompt cannot carry.

    Raises:
        InputError: It is not text, holds a lone surrogate or a control character the prompt
            layout reserves (U+0000, U+0001, U+0002).
    """
    check_text(instruction, "the instruction")
    for reserved in (_CHUNKS_MARKER[0], "\x01", _TURN_MARKER):
        if reserved in instruction:
            raise InputError(
                f"the instruction holds the control character U+{ord(reserved):04X}, which the "
                "prompt layout reserves; remove it"
            )


def instruction_note(instruction: str) -> str:
    """The text an instruction puts before the question (none for a blank one)."""
    return f"{instruction.strip()}\n" if instruction.strip() else ""


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
