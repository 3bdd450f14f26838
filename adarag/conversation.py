"""A multi-turn conversation: which earlier turns a new message carries.

The pipeline puts the carried turns into the prompt as chat turns after the context (so the
system prefix and the chunks' KV stay reusable) and retrieves for their messages and answers
together with the new one (``chat.standalone_question``), so a follow-up such as "When did she
die?" still finds the passages about the person asked or told about before. A turn answered
without context (nothing relevant was retrieved) is not carried: its answer says nothing about
the knowledge base, and a model shown it tends to repeat it.

With ``experimental.arrangement.deduplicate`` the conversation also carries its context: the
last grounded answer's chunks, in listed order, which open the next turn's context (a hard
prefix of the previous prompt) so a chunk retrieved again is not listed twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from adarag.schema import Chunk


@dataclass
class Conversation:
    """The turns so far, and how many of them each new message carries.

    Example:
        >>> conversation = Conversation()
        >>> answer = rag.query(
        ...     message, history=conversation.history(), conversation_chunks=conversation.chunks
        ... )
        >>> conversation.add_turn(message, answer.text, chunks=answer.chunks)

    Attributes:
        max_turns: Earlier turns carried into retrieval and the prompt.
        turns: (user message, answer) pairs of grounded turns, oldest first.
        chunks: The last grounded turn's context in listed order.
    """

    max_turns: int = 2
    turns: list[tuple[str, str]] = field(default_factory=list)
    chunks: list[Chunk] = field(default_factory=list)

    def history(self) -> list[tuple[str, str]]:
        """The recent turns a new message carries, oldest first."""
        return self.turns[-self.max_turns :] if self.max_turns else []

    def add_turn(
        self,
        message: str,
        answer: str,
        *,
        grounded: bool = True,
        chunks: Sequence[Chunk] | None = None,
    ) -> None:
        """Record a finished turn; one answered without context is dropped.

        Args:
            message: The user's message.
            answer: The answer's text.
            grounded: False when the answer had no context.
            chunks: The answer's chunks; when given, an empty tuple means not grounded, and a
                grounded turn's chunks become the conversation's context.
        """
        if chunks is not None:
            grounded = grounded and bool(chunks)
        if grounded:
            self.turns.append((message, answer))
            if chunks is not None:
                self.chunks = list(chunks)
