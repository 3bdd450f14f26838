"""Conversions between adarag values and LangChain ones."""

from __future__ import annotations

from typing import Any

from langchain_core.documents import Document
from langchain_core.messages import BaseMessage, convert_to_messages
from langchain_core.messages.ai import UsageMetadata

from adarag import Answer, Chunk, InputError

_ROLES = {"system": "system", "human": "user", "ai": "assistant", "tool": "tool"}


def document_from_chunk(chunk: Chunk) -> Document:
    """A Document with the chunk's text, id, and score in its metadata."""
    metadata: dict[str, Any] = dict(chunk.metadata)
    if chunk.score is not None:
        metadata["score"] = chunk.score
    return Document(page_content=chunk.text, id=chunk.chunk_id, metadata=metadata)


def usage_metadata(answer: Answer) -> UsageMetadata:
    """Prompt, completion and cached tokens (``cache_read``: prompt KV taken from the cache)."""
    prompt_tokens = answer.trace.num_prompt_tokens
    return UsageMetadata(
        input_tokens=prompt_tokens,
        output_tokens=answer.num_completion_tokens,
        total_tokens=prompt_tokens + answer.num_completion_tokens,
        input_token_details={"cache_read": answer.num_cached_tokens},
    )


def chat_messages(messages: list[BaseMessage]) -> list[dict[str, str]]:
    """Messages as ``{"role", "content"}`` for the model's chat template."""
    return [{"role": _ROLES.get(m.type, "user"), "content": m.text} for m in messages]


def conversation_turns(history: Any) -> list[tuple[str, str]]:
    """``chat_history`` (messages, ``(role, text)`` pairs or dicts) as (question, answer) turns.

    Each human message followed by an AI message makes a turn; system messages and unanswered
    questions are left out.

    Raises:
        InputError: ``history`` is not a list of chat messages.
    """
    if not isinstance(history, list | tuple):
        raise InputError(f"chat_history must be a list of messages, got {type(history).__name__}")
    try:
        messages = convert_to_messages(history)
    except (ValueError, TypeError, NotImplementedError) as err:
        raise InputError(
            f"chat_history holds something that is not a chat message ({err}); pass "
            "messages, (role, text) pairs or {'role', 'content'} dicts"
        ) from err
    turns: list[tuple[str, str]] = []
    for asked, answered in zip(messages, messages[1:], strict=False):
        if asked.type == "human" and answered.type == "ai":
            turns.append((asked.text, answered.text))
    return turns
