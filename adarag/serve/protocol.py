"""Request bodies: OpenAI's chat and text completions, and adarag's RAG query.

Fields OpenAI defines that adarag does not serve (several choices, tools, JSON response
formats, log-probabilities, echo) are refused with 400 when set; other unknown fields of the
OpenAI bodies are ignored, as OpenAI-compatible servers do, so clients that send optional
extras keep working.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from adarag.pipeline.answer_stream import NO_CONTEXT_ANSWER
from adarag.schema import GenerationParams, Seed

Turn = tuple[str, str]


class StreamOptions(BaseModel):
    """OpenAI's ``stream_options``."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    include_usage: bool = False


class _OpenAIBody(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    model: str = Field(min_length=1, description="Any id; the server's one model answers.")
    max_tokens: int | None = Field(default=None, ge=1, le=8192)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: Seed | None = None
    n: int = Field(default=1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: Any = None
    top_k: int | None = Field(default=None, ge=1, description="Chunks to retrieve (with rag).")

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value: int) -> int:
        if value != 1:
            raise ValueError(f"only one choice per request is served, got n={value}; pass n=1")
        return value

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, value: Any) -> Any:
        if value not in (None, False, 0):
            raise ValueError("log-probabilities are not served; leave logprobs unset")
        return value

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, value: str | list[str] | None) -> str | list[str] | None:
        strings = [value] if isinstance(value, str) else value or []
        if any(not text for text in strings):
            raise ValueError("stop strings must not be empty")
        return value

    def params(self, default_max_tokens: int) -> GenerationParams:
        """The decoding options (``default_max_tokens`` when the body sets none)."""
        stop = [self.stop] if isinstance(self.stop, str) else self.stop or []
        return GenerationParams(
            max_new_tokens=self._max_tokens() or default_max_tokens,
            temperature=0.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            stop=tuple(stop),
            seed=self.seed,
        )

    @property
    def include_usage(self) -> bool:
        """Whether a stream ends with a usage chunk (``stream_options.include_usage``)."""
        return self.stream_options is not None and self.stream_options.include_usage

    def _max_tokens(self) -> int | None:
        return self.max_tokens


class TextPart(BaseModel):
    """A text part of a message's content (the only kind served)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One message of a chat request."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None

    @property
    def text(self) -> str:
        """The content as one string (text parts joined)."""
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(_OpenAIBody):
    """``POST /v1/chat/completions``.

    With ``rag`` (the default) the last message is the question, answered from the knowledge
    base; earlier (user, assistant) pairs are the conversation's history, and the system (and
    developer) messages are the answer's instruction (:meth:`instruction`), which goes right
    before the question: the server's system prompt (``prompt.system_prompt``) and the cached
    context stay as they are. With ``"rag": false`` every message goes to the model's chat
    template as is, without retrieval.
    """

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=8192)
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None
    rag: bool = True

    @field_validator("tools")
    @classmethod
    def _no_tools(cls, value: list[Any] | None) -> list[Any] | None:
        if value:
            raise ValueError("tool calling is not served; send no tools")
        return value

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and value.get("type", "text") != "text":
            raise ValueError(
                f"response_format {value.get('type')!r} is not served: adarag has no constrained "
                "(JSON schema) decoding, so JSON output cannot be guaranteed; leave "
                "response_format unset (or {'type': 'text'}), ask for JSON in the prompt and "
                "parse the answer"
            )
        return value

    def _max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def conversation(self, history_turns: int) -> tuple[str, list[Turn]]:
        """The question (the last message, a user's) and the last ``history_turns`` turns.

        A turn is a user message directly followed by an assistant message; a turn answered
        with the no-context answer is left out, as :class:`~adarag.conversation.Conversation`
        leaves out ungrounded turns.

        Raises:
            ValueError: The last message is not a user message.
        """
        last = self.messages[-1]
        if last.role != "user":
            raise ValueError(
                f"messages: the last message must be the user's question, got a {last.role!r} "
                "message"
            )
        talk = [m for m in self.messages[:-1] if m.role in ("user", "assistant")]
        turns = [
            (asked.text, answered.text)
            for asked, answered in zip(talk, talk[1:], strict=False)
            if asked.role == "user"
            and answered.role == "assistant"
            and answered.text.strip() != NO_CONTEXT_ANSWER
        ]
        return last.text, turns[-history_turns:] if history_turns else []

    def instruction(self) -> str:
        """The system and developer messages' text, one per line (empty without any)."""
        texts = (m.text.strip() for m in self.messages if m.role in ("system", "developer"))
        return "\n".join(text for text in texts if text)

    def chat_messages(self) -> list[dict[str, str]]:
        """Every message as ``{"role", "content"}`` (developer as system), for the template."""
        return [
            {"role": "system" if m.role == "developer" else m.role, "content": m.text}
            for m in self.messages
        ]


class CompletionRequest(_OpenAIBody):
    """``POST /v1/completions``.

    The prompt is text the model continues, without retrieval (as OpenAI's completions); with
    ``"rag": true`` it is a question answered from the knowledge base instead.
    """

    prompt: str | list[str]
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None
    rag: bool = False

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list) and len(value) != 1:
            raise ValueError(f"pass one prompt per request, got a list of {len(value)}")
        return value

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value: bool) -> bool:
        if value:
            raise ValueError("echo is not served; leave it false")
        return value

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> str | None:
        if value:
            raise ValueError("insertion (suffix) is not served; leave it unset")
        return value

    @field_validator("best_of")
    @classmethod
    def _no_best_of(cls, value: int | None) -> int | None:
        if value not in (None, 1):
            raise ValueError(f"best_of must be 1 (one choice is served), got {value}")
        return value

    @property
    def prompt_text(self) -> str:
        """The one prompt."""
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


class RagQueryRequest(GenerationParams):
    """``POST /v1/rag/query``: a question answered from the knowledge base, with its sources.

    The decoding fields are :class:`~adarag.schema.GenerationParams`' (``max_new_tokens``,
    ``temperature``, ``top_p``, ``stop``, ``seed``); unknown fields are refused.
    """

    question: str = Field(min_length=1, description="What to answer.")
    history: list[Turn] = Field(
        default_factory=list,
        description="Earlier turns, oldest first, as [question, answer] pairs.",
    )
    top_k: int | None = Field(default=None, ge=1, description="Chunks to retrieve.")
    chunks: list[str] | None = Field(
        default=None, description="The context to answer from instead of retrieving."
    )

    def params(self) -> GenerationParams:
        """The decoding options of the body."""
        return GenerationParams(**self.model_dump(include=set(GenerationParams.model_fields)))
