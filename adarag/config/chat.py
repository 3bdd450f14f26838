"""How a conversation's follow-up is retrieved for and its earlier context carried."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from adarag.config.base import _Frozen

CONDENSE_PROMPT = (
    "Given a conversation (between Human and Assistant) and a follow up message from Human, "
    "rewrite the message to be a standalone question that captures all relevant context from "
    "the conversation.\n\n<Chat History>\n{chat_history}\n\n<Follow Up Message>\n{question}\n\n"
    "<Standalone question>\n"
)
"""LlamaIndex's ``CondenseQuestionChatEngine`` prompt."""


class ChatConfig(_Frozen):
    """How a conversation's follow-up is retrieved for and its earlier context carried."""

    standalone_question: Literal["turns", "concatenate", "condense"] = Field(
        default="turns",
        description="What a follow-up is retrieved with: 'turns' (the earlier questions, the "
        "follow-up, then the earlier answers, so 'Where was she born?' after the answer 'Marta "
        "Kowalski.' is searched with the name; no model call), 'concatenate' (the earlier "
        "questions, then the follow-up) or 'condense' (the model rewrites the follow-up and the "
        "earlier turns into a standalone question, as LlamaIndex's CondenseQuestionChatEngine "
        "does). In `benchmarks/conversations.py standalone` (20 2WikiMultihopQA follow-ups such as "
        "'Where was this person born?') the gold passage was in the top 4 for 30% of follow-ups "
        "with Qwen2.5-0.5B and 10% with SmolLM2 with 'turns', none with 'concatenate', 20% and "
        "10% with 'condense' (one model call of 0.9-1.5 s on 2 CPU cores).",
    )
    condense_prompt: str = Field(
        default=CONDENSE_PROMPT,
        description="The condensing prompt (a user message); must contain '{chat_history}' and "
        "'{question}'.",
    )
    max_condense_tokens: int = Field(
        default=48, ge=4, le=512, description="Tokens the standalone question may take."
    )

    @model_validator(mode="after")
    def _check_templates(self) -> ChatConfig:
        for name in ("{chat_history}", "{question}"):
            if name not in self.condense_prompt:
                raise ValueError(f"condense_prompt must contain '{name}'")
        return self
