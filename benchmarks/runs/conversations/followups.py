"""Follow-ups from 2WikiMultihopQA's compositional questions: a question, then one on its answer."""

from __future__ import annotations

import re
from dataclasses import dataclass

_ROLE = re.compile(
    r"the (director|performer|composer) of (film|song) (.+?)"
    r"(?= born| die| work| study| detained|\?)",
    re.IGNORECASE,
)
_RELATIVE = re.compile(r"([A-Z][^?]*?)'s (father|mother|husband|wife|son|daughter|child)\b")
_REFERENCE = "this person"


@dataclass(frozen=True)
class FollowUp:
    """A first question, a follow-up referring to its answer, and the follow-up's gold."""

    first: str
    follow_up: str
    original: str
    gold_title: str
    gold_titles: tuple[str, ...]
    answers: tuple[str, ...]


def _plain(title: str) -> str:
    return re.sub(r"\s*\(.*?\)\s*", " ", title).strip().lower()


def build_followups(rows: list[dict], limit: int) -> list[FollowUp]:
    """Up to ``limit`` follow-ups from compositional questions with two gold titles."""
    found = []
    for row in rows:
        titles = row.get("gold_titles") or []
        if row.get("type") != "compositional" or len(titles) != 2:
            continue
        question = row["question"]
        role = _ROLE.search(question)
        relative = _RELATIVE.search(question)
        if role is not None:
            subject = role.group(3)
            first = f"Who is the {role.group(1).lower()} of {role.group(2).lower()} {subject}?"
            follow_up = question[: role.start()] + _REFERENCE + question[role.end() :]
        elif relative is not None:
            subject = relative.group(1)
            first = f"Who is {subject}'s {relative.group(2)}?"
            follow_up = question[: relative.start()] + _REFERENCE + question[relative.end() :]
        else:
            continue
        others = [t for t in titles if _plain(t) != _plain(subject)]
        if len(others) != 1:
            continue
        found.append(
            FollowUp(
                first,
                follow_up[0].upper() + follow_up[1:],
                question,
                others[0],
                tuple(titles),
                tuple(row["answers"]),
            )
        )
        if len(found) == limit:
            break
    return found
