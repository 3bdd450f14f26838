"""The text a conversation's question is retrieved with (``chat.standalone_question``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from adarag.config import ChatConfig
from adarag.pipeline.prompt import Turn, condense_prompt, retrieval_query
from adarag.schema import GenerationParams

# the records keep the name of the pipeline's logger
logger = logging.getLogger("adarag.pipeline.rag")

# chat messages and decoding options -> the model's answer text
Generate = Callable[[Sequence[Mapping[str, str]], GenerationParams], str]


def standalone_question(
    config: ChatConfig, question: str, history: Sequence[Turn], generate: Generate
) -> str:
    """What ``question`` is retrieved with, after the earlier turns ``history``.

    ``"turns"``: the earlier questions, this one, then the earlier answers
    (:func:`retrieval_query` with answers), so a follow-up finds what an earlier answer named;
    ``"concatenate"``: the earlier questions, then this one; ``"condense"``: the model's rewrite
    of the question and the earlier turns as one standalone question (greedy, at most
    ``config.max_condense_tokens`` tokens; its first line), or the turns when the rewrite comes
    out empty. Without history it is ``question`` itself.

    Args:
        config: The chat settings.
        question: The new message.
        history: The earlier turns carried, oldest first.
        generate: Answers chat messages with the pipeline's model (for ``"condense"``).
    """
    if not history or config.standalone_question != "condense":
        return retrieval_query(
            question, history, with_answers=config.standalone_question == "turns"
        )
    prompt = condense_prompt(config.condense_prompt, question, history)
    params = GenerationParams(max_new_tokens=config.max_condense_tokens)
    rewrite = generate([{"role": "user", "content": prompt}], params)
    lines = [line.strip() for line in rewrite.strip().splitlines() if line.strip()]
    if not lines:
        logger.warning("the condensed question came out empty; retrieving with the turns")
        return retrieval_query(question, history, with_answers=True)
    return lines[0]
