"""Conversations: two- and three-turn chats built from 2WikiMultihopQA, and what follow-ups cost.

The conversations: "Where was the director of film Blood Street born?" becomes the first question
"Who is the director of film Blood Street?" and the follow-up "Where was this person born?",
whose gold passage is the person's (the gold title that is not the film's) and whose answer is
the original question's. Questions about "X's father" (mother, husband, ...) are split the same
way.

``turn-reuse``: tokens computed and TTFT per turn of a 3-turn conversation, earlier turns reused
or not. Each conversation asks the first question, the follow-up and the original question, over
the same passages (the two gold passages and two others, warmed as ingest warms them).
``prompt.enable_turn_reuse`` on: each earlier turn is a cached segment, so a turn computes the
turn it adds and its question; off: the earlier turns sit in the query suffix and are recomputed
every turn. Each mode has a KV store of its own.

``standalone``: the standalone question for a follow-up, concatenating the questions vs
condensing with the model. The model answers the first question from the top-k passages of the
6,119-passage corpus (MiniLM cosine search), then the follow-up ("Where was this person born?")
is retrieved for with each ``chat.standalone_question`` method ("concatenate": the questions;
"turns": the questions and the first answer; "condense": the model's rewrite) and answered with
the first turn as history. Reported per method: recall of the follow-up's gold passage in the
top 4 and top 10, answer F1 / EM against the original question's answers, and the seconds spent
making the retrieval text (the condensing call). "The follow-up alone" is retrieval without the
conversation, for reference (recall only).

    python benchmarks/conversations.py turn-reuse --model default --conversations 5
    python benchmarks/conversations.py standalone --model default --questions 20
    python benchmarks/conversations.py standalone \
        --replay benchmarks/results/conversations/standalone_question_<model>.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common import run_subcommand
from runs.conversations.standalone import standalone_question
from runs.conversations.turn_reuse import turn_reuse


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    command = sub.add_parser("turn-reuse", help="tokens and TTFT per turn, earlier turns reused")
    command.add_argument("--model", default="default")
    command.add_argument("--conversations", type=int, default=5)
    command.add_argument("--data-dir", type=Path, default=None)
    command.add_argument("--work-dir", type=Path, default=Path("/tmp/adarag-turn-reuse"))
    command.set_defaults(fn=turn_reuse)
    command = sub.add_parser("standalone", help="the standalone question of a follow-up")
    command.add_argument("--model", default="default")
    command.add_argument("--questions", type=int, default=20)
    command.add_argument("--data-dir", type=Path, default=None)
    command.add_argument("--work-dir", type=Path, default=Path("/tmp/adarag-standalone-question"))
    command.add_argument(
        "--replay",
        type=Path,
        help="an earlier run's .json: no model runs; its first answers and condensed questions "
        "are reused, every method's retrieval is measured again, and methods it lacks are "
        "measured for retrieval only (their answer F1 is left blank)",
    )
    command.set_defaults(fn=standalone_question)
    run_subcommand(parser)


if __name__ == "__main__":
    main()
