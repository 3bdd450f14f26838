"""Workloads of many requests over shared documents: multi-turn chats and many users.

Both are built from 2WikiMultihopQA (its questions and its 6K-passage corpus) and are
deterministic given the seed.

- **Multi-turn chat** (:func:`multi_turn_workload`): a conversation is a chain of questions
  about the same entities -- questions whose gold passages share a title (union of the
  questions linked by a shared title), asked in dataset order. Each turn retrieves by BM25 over
  the corpus with the conversation's earlier questions and the new one (as the pipeline
  retrieves for a conversation, :func:`~adarag.pipeline.prompt.retrieval_query`), so follow-up
  turns bring back chunks of earlier turns. Turns are interleaved across conversations
  (round-robin), each conversation's turns in order.
- **Multi-user** (:func:`multi_user_workload`): each user asks their own questions; a request's
  context is its gold passages plus distractors drawn from the corpus by a Zipf popularity
  (``p(rank r) ~ 1 / r^s`` over a seeded ranking of the corpus), so popular documents recur
  across users at different positions, as in RAGBoost's multi-session traces; the context is
  shuffled per request (seeded by the request). Requests are interleaved across users.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

from adarag.evaluation.workload import CORPUS_FILE, BenchQuestion, StreamItem
from adarag.pipeline.prompt import retrieval_query
from adarag.retrievers import MemoryRetriever
from adarag.retrievers.chunking import passage_text
from adarag.schema import Chunk

WORKLOADS = ("multi-turn", "multi-user")


def multi_turn_workload(
    data_dir: Path,
    num_conversations: int,
    top_k: int,
    seed: int,
    max_turns: int = 3,
    history_turns: int = 2,
) -> tuple[list[BenchQuestion], list[StreamItem]]:
    """Conversations of 2 to ``max_turns`` linked 2Wiki questions, turns interleaved.

    Args:
        data_dir: Folder with ``2wikimqa_dev.jsonl`` and the corpus.
        num_conversations: How many conversations (a seeded sample of all that exist).
        top_k: Chunks retrieved per turn.
        seed: Picks the conversations.
        max_turns: Turns kept per conversation (its first ones).
        history_turns: Earlier questions the retrieval query carries.
    """
    rows = _rows(data_dir / "2wikimqa_dev.jsonl")
    chains = [chain[:max_turns] for chain in _title_chains(rows) if len(chain) >= 2]
    rng = random.Random(seed)
    picked = sorted(rng.sample(range(len(chains)), min(num_conversations, len(chains))))
    retriever = MemoryRetriever(_corpus(data_dir))
    conversations: list[list[BenchQuestion]] = []
    for number in picked:
        turns: list[BenchQuestion] = []
        for row in (rows[idx] for idx in chains[number]):
            earlier = [(turn.question, "") for turn in turns][-history_turns:]
            query = retrieval_query(row["question"], earlier)
            texts = tuple(chunk.text for chunk in retriever.retrieve(query, top_k))
            turns.append(
                BenchQuestion(
                    str(row["id"]),
                    row["question"],
                    tuple(row["answers"]),
                    texts,
                    row.get("type"),
                    conversation=f"chat-{number}",
                )
            )
        conversations.append(turns)
    return _interleave(conversations)


def multi_user_workload(
    data_dir: Path,
    num_users: int,
    questions_per_user: int,
    top_k: int,
    seed: int,
    zipf_s: float = 1.1,
) -> tuple[list[BenchQuestion], list[StreamItem]]:
    """Users asking their own 2Wiki questions over Zipf-popular shared distractors.

    Args:
        data_dir: Folder with ``2wikimqa_dev.jsonl`` and the corpus.
        num_users: How many users.
        questions_per_user: Requests per user.
        top_k: Passages per request (gold first filled up with distractors).
        seed: Picks the questions and the corpus's popularity ranking.
        zipf_s: Exponent of the popularity law.
    """
    rows = _rows(data_dir / "2wikimqa_dev.jsonl")
    corpus = _corpus(data_dir)
    rng = random.Random(seed)
    by_title: dict[str, list[str]] = {}
    for chunk in corpus:
        by_title.setdefault(chunk.metadata["title"], []).append(chunk.text)
    usable = [
        row
        for row in rows
        if row.get("gold_titles")
        and all(t in by_title for t in row["gold_titles"])
        and sum(len(by_title[t]) for t in row["gold_titles"]) < top_k
    ]
    picked = rng.sample(usable, min(num_users * questions_per_user, len(usable)))
    popularity = list(range(len(corpus)))
    rng.shuffle(popularity)
    weights = [1.0 / (rank + 1) ** zipf_s for rank in range(len(corpus))]
    users: list[list[BenchQuestion]] = [[] for _ in range(num_users)]
    for number, row in enumerate(picked):
        gold = [text for title in row["gold_titles"] for text in by_title[title]]
        request_rng = random.Random(f"{seed}-{row['id']}")
        context = list(dict.fromkeys(gold))
        while len(context) < top_k:
            doc = corpus[popularity[request_rng.choices(range(len(corpus)), weights)[0]]].text
            if doc not in context:
                context.append(doc)
        request_rng.shuffle(context)
        user = number % num_users
        users[user].append(
            BenchQuestion(
                f"user{user}-{row['id']}",
                row["question"],
                tuple(row["answers"]),
                tuple(context),
                row.get("type"),
            )
        )
    return _interleave(users)


def _title_chains(rows: Sequence[dict]) -> list[list[int]]:
    """Groups of row indices linked by shared gold titles (union-find), each in row order."""
    parent = list(range(len(rows)))

    def find(idx: int) -> int:
        while parent[idx] != idx:
            parent[idx] = parent[parent[idx]]
            idx = parent[idx]
        return idx

    first_with: dict[str, int] = {}
    for idx, row in enumerate(rows):
        for title in row.get("gold_titles") or ():
            if title in first_with:
                parent[find(idx)] = find(first_with[title])
            else:
                first_with[title] = idx
    groups: dict[int, list[int]] = {}
    for idx in range(len(rows)):
        groups.setdefault(find(idx), []).append(idx)
    return sorted(groups.values(), key=lambda group: group[0])


def _interleave(
    sessions: Sequence[Sequence[BenchQuestion]],
) -> tuple[list[BenchQuestion], list[StreamItem]]:
    """Questions in round-robin order over sessions (each session's in order), asked once."""
    questions: list[BenchQuestion] = []
    for turn in range(max((len(s) for s in sessions), default=0)):
        questions += [session[turn] for session in sessions if turn < len(session)]
    return questions, [StreamItem(idx, False) for idx in range(len(questions))]


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _corpus(data_dir: Path) -> list[Chunk]:
    return [
        Chunk(passage_text(row["text"], row["title"]), row["id"], metadata={"title": row["title"]})
        for row in _rows(data_dir / CORPUS_FILE)
    ]
