"""``conversations.py``'s subcommands: chats built from 2WikiMultihopQA, what follow-ups cost."""

from __future__ import annotations

from common import RESULTS

OUTPUT = RESULTS / "conversations"
