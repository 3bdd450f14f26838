"""A multi-turn conversation condensed into one retrieval query and one question per turn.

Retrieval sees the recent user turns before the new message, so a follow-up such as "When did
she die?" still finds the passages about the person asked about before. The model sees the new
message with the recent exchange before it. Plain Python; no model call is spent on condensing.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Conversation:
    """The turns so far, and how much of them each new message carries.

    Example:
        >>> conversation = Conversation()
        >>> stream = rag.stream(conversation.question(message),
        ...                     chunks=rag.retrieve(conversation.retrieval_query(message)))
        >>> conversation.add_turn(message, stream.answer().text)

    Attributes:
        max_turns: Earlier turns carried into retrieval and the question.
        turns: (user message, answer) pairs, oldest first.
    """

    max_turns: int = 2
    turns: list[tuple[str, str]] = field(default_factory=list)

    def retrieval_query(self, message: str) -> str:
        """The recent user messages and ``message``, joined: what the retriever searches for."""
        recent = (
            [question for question, _ in self.turns[-self.max_turns :]] if self.max_turns else []
        )
        return "\n".join([*recent, message])

    def question(self, message: str) -> str:
        """``message`` after the recent exchange: what the model answers."""
        if not self.turns or not self.max_turns:
            return message
        history = " ".join(
            f"Earlier question: {question} Earlier answer: {answer}"
            for question, answer in self.turns[-self.max_turns :]
        )
        return f"{history} Now answer: {message}"

    def add_turn(self, message: str, answer: str) -> None:
        """Record a finished turn."""
        self.turns.append((message, answer))
