"""The QA prompt as a LlamaIndex template, mapped onto adarag's prompt segments.

adarag lays a prompt out as ``[system prefix][chunk 1]...[chunk k][query suffix]`` (see
``adarag.config.PromptConfig``). A QA template maps onto it when ``{context_str}`` comes before
``{query_str}``: the text before the context becomes ``context_intro``, the text after it (with
the question) ``question_template``, and a chat template's system message ``system_prompt``.
"""

from __future__ import annotations

from typing import Any

from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.prompts import (
    BasePromptTemplate,
    ChatPromptTemplate,
    PromptTemplate,
    SelectorPromptTemplate,
)

from adarag import ConfigError
from adarag.config import PromptConfig

CONTEXT_VAR = "{context_str}"
QUERY_VAR = "{query_str}"


def template_from_config(prompt: PromptConfig) -> ChatPromptTemplate:
    """The QA template that lays prompts out as ``prompt`` does."""
    user = (
        _escape(prompt.context_intro)
        + CONTEXT_VAR
        + prompt.question_template.replace("{question}", QUERY_VAR)
    )
    return ChatPromptTemplate(
        message_templates=[
            ChatMessage(role=MessageRole.SYSTEM, content=_escape(prompt.system_prompt)),
            ChatMessage(role=MessageRole.USER, content=user),
        ]
    )


def prompt_overrides(template: BasePromptTemplate) -> dict[str, Any]:
    """``PromptConfig`` fields that lay prompts out as ``template`` does.

    Raises:
        ConfigError: The template lacks ``{context_str}`` before ``{query_str}``, has other
            unfilled variables, or more than one system and one user message.
    """
    if isinstance(template, SelectorPromptTemplate):
        template = template.default_template
    overrides: dict[str, Any] = {}
    if isinstance(template, ChatPromptTemplate):
        system = [m for m in template.message_templates if m.role == MessageRole.SYSTEM]
        user = [m for m in template.message_templates if m.role == MessageRole.USER]
        if (
            len(system) > 1
            or len(user) != 1
            or len(system) + len(user) != len(template.message_templates)
        ):
            raise ConfigError(
                "a chat QA template needs one user message (and at most one system message), "
                f"got roles {[m.role.value for m in template.message_templates]}"
            )
        if system:
            overrides["system_prompt"] = _unescape(_fill(system[0].content or "", template))
        body = _fill(user[0].content or "", template)
    elif isinstance(template, PromptTemplate):
        body = _fill(template.template, template)
    else:
        raise ConfigError(f"unsupported prompt template {type(template).__name__}")
    context_at, query_at = body.find(CONTEXT_VAR), body.find(QUERY_VAR)
    if context_at < 0 or query_at < context_at:
        raise ConfigError(
            "the QA template must contain {context_str} and, after it, {query_str} (adarag puts "
            f"the chunks before the question); got {body!r}"
        )
    overrides["context_intro"] = _unescape(body[:context_at])
    overrides["question_template"] = body[context_at + len(CONTEXT_VAR) :].replace(
        QUERY_VAR, "{question}"
    )
    PromptConfig(**overrides)  # validate now, with the template in the traceback
    return overrides


def _fill(text: str, template: BasePromptTemplate) -> str:
    """Apply the template's partial variables; refuse any other unfilled variable."""
    for name, value in template.kwargs.items():
        text = text.replace("{" + name + "}", _escape(str(value)))
    unknown = set(template.template_vars) - {"context_str", "query_str"} - set(template.kwargs)
    if unknown:
        raise ConfigError(
            f"the QA template has variables {sorted(unknown)} that adarag cannot fill; fill them "
            "with partial_format(...) first"
        )
    return text


def _escape(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def _unescape(text: str) -> str:
    return text.replace("{{", "{").replace("}}", "}")
