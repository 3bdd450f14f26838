"""A multi-turn conversation: which earlier turns a new message carries.

The pipeline puts the carried turns into the prompt as chat turns after the context (so the
system prefix and the chunks' KV stay reusable) and retrieves for their messages together with
the new one, so a follow-up such as "When did she die?" still finds the passages about the
person asked about before. A turn answered without context (nothing relevant was retrieved) is
not carried: its answer says nothing about the knowledge base, and a model shown it tends to
repeat it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Conversation:
    """The turns so far, and how many of them each new message carries.

    Example:
        >>> conversation = Conversation()
        >>> answer = rag.query(message, history=conversation.history())
        >>> conversation.add_turn(message, answer.text, grounded=bool(answer.chunks))

    Attributes:
        max_turns: Earlier turns carried into retrieval and the prompt.
        turns: (user message, answer) pairs of grounded turns, oldest first.
    """

    max_turns: int = 2
    turns: list[tuple[str, str]] = field(default_factory=list)

    def history(self) -> list[tuple[str, str]]:
        """The recent turns a new message carries, oldest first."""
        return self.turns[-self.max_turns :] if self.max_turns else []

    def add_turn(self, message: str, answer: str, *, grounded: bool = True) -> None:
        """Record a finished turn; one answered without context (``grounded=False``) is dropped."""
        if grounded:
            self.turns.append((message, answer))
