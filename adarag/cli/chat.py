"""``adarag chat``: a multi-turn terminal chat over the Chroma knowledge base."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from adarag.cli.display import describe, stream_answer
from adarag.cli.options import (
    add_knowledge_base_arguments,
    add_model_arguments,
    answer_tokens,
    build_config,
    non_negative_int,
    open_knowledge_base,
)
from adarag.conversation import Conversation
from adarag.pipeline import AdaRAG
from adarag.pipeline.answer_stream import AnswerStream
from adarag.schema import GenerationParams

HELP = "chat with the knowledge base; each answer shows its sources, TTFT and cache tiers"
EXIT_WORDS = frozenset({"exit", "quit", ":q"})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the command's options."""
    parser.add_argument(
        "--max-new-tokens",
        type=answer_tokens,
        default=64,
        help="answer tokens generated at most per turn (default: 64)",
    )
    parser.add_argument(
        "--history-turns", type=non_negative_int, default=2, help="turns carried forward"
    )
    parser.add_argument(
        "--condense",
        action="store_true",
        help="retrieve for a follow-up with the model's standalone rewrite of it "
        "(chat.standalone_question='condense') instead of the earlier questions and answers "
        "joined to it",
    )
    parser.add_argument(
        "--citations", action="store_true", help="number the passages and cite them as [1], [2]"
    )
    add_knowledge_base_arguments(parser)
    add_model_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Read messages until EOF or 'exit'; answer each from the knowledge base."""
    overrides: dict[str, Any] = {}
    if args.condense:
        overrides["chat"] = {"standalone_question": "condense"}
    if args.citations:
        overrides["prompt"] = {"citations": True}
    config = build_config(args, **overrides)
    params = GenerationParams(max_new_tokens=args.max_new_tokens)
    with open_knowledge_base(config) as kb:
        rag = AdaRAG(config, retriever=kb)
        _ = rag.engine  # load the model before the first prompt
        conversation = Conversation(max_turns=args.history_turns)
        print(f"chatting with {kb.count()} chunks of {config.retrieval.collection!r}; 'exit' ends")
        while (message := _read(">>> ")) is not None:
            try:
                if message:
                    _turn(rag, message, conversation, params)
            except KeyboardInterrupt:  # Ctrl-C cancels this answer, not the chat
                print("\n   (answer cancelled; the turn is not kept)")
    return 0


def _turn(rag: AdaRAG, message: str, conversation: Conversation, params: GenerationParams) -> None:
    """Answer ``message``, show its figures and keep the turn.

    Ctrl-C may come during retrieval and prefill (before the first token) or while tokens
    stream; either way the stream is closed, so the engine is free for the next message, and
    the KeyboardInterrupt goes on to the caller.
    """
    stream: AnswerStream | None = None
    try:
        stream = rag.stream(
            message,
            history=conversation.history(),
            params=params,
            conversation_chunks=conversation.chunks,
        )
        answer = stream_answer(stream)
    except KeyboardInterrupt:
        if stream is not None:
            stream.close()
        raise
    print("\n".join(describe(answer)))
    conversation.add_turn(message, answer.text, chunks=answer.chunks)


def _read(prompt: str) -> str | None:
    """The next message, or None at EOF, Ctrl-C at the prompt, or an exit word.

    At a terminal the line is read with ``readline`` editing and history.
    """
    try:
        if sys.stdin.isatty():
            import readline  # noqa: F401  (importing it gives input() line editing)

            line = input(prompt)
        else:
            line = sys.stdin.readline()
    except (EOFError, KeyboardInterrupt):
        print()
        return None
    if not sys.stdin.isatty() and not line:
        return None
    message = line.strip()
    return None if message.lower() in EXIT_WORDS else message
