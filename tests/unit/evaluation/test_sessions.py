"""The multi-turn and multi-user workloads: deterministic, and shaped as they claim."""

from __future__ import annotations

from collections import Counter

from adarag.evaluation.sessions import multi_turn_workload, multi_user_workload


def test_multi_turn_conversations_share_chunks_across_turns(data_dir):
    questions, stream = multi_turn_workload(data_dir, num_conversations=3, top_k=4, seed=1)
    assert multi_turn_workload(data_dir, 3, 4, seed=1) == (questions, stream)
    conversations: dict[str, list] = {}
    for item in stream:
        question = questions[item.question_idx]
        conversations.setdefault(question.conversation, []).append(question)
    assert len(conversations) == 3
    for turns in conversations.values():
        assert len(turns) >= 2
        assert [t.qid for t in turns] == sorted(t.qid for t in turns)  # dataset order
        for earlier, later in zip(turns, turns[1:], strict=False):
            assert set(earlier.chunks) & set(later.chunks)  # a follow-up over shared chunks
    # turns interleave across conversations: the first turns come first
    firsts = [questions[item.question_idx].qid for item in stream[:3]]
    assert all(qid.endswith("a") for qid in firsts)


def test_multi_user_requests_share_popular_documents(data_dir):
    questions, stream = multi_user_workload(
        data_dir, num_users=4, questions_per_user=2, top_k=6, seed=5
    )
    assert multi_user_workload(data_dir, 4, 2, 6, seed=5) == (questions, stream)
    assert multi_user_workload(data_dir, 4, 2, 6, seed=6) != (questions, stream)
    assert len(questions) == len(stream) == 8
    users = Counter(q.qid.split("-")[0] for q in questions)
    assert users == {f"user{n}": 2 for n in range(4)}
    counts = Counter(chunk for q in questions for chunk in q.chunks)
    most_common = counts.most_common(1)[0][1]
    assert most_common >= 4  # a popular document recurs across users
    for question in questions:
        assert len(question.chunks) == len(set(question.chunks)) == 6
        titles = question.question.replace("?", "").replace(",", "").split()
        gold = [t for t in titles if t.startswith("person")]
        assert all(any(chunk.startswith(g) for chunk in question.chunks) for g in gold)


def test_the_harness_carries_conversations_and_schedules_ragboost(
    data_dir, tiny_checkpoints, tiny_config, tmp_path
):
    from adarag.engine.core import Engine
    from adarag.evaluation.harness import BenchRunner
    from adarag.policies import POLICIES
    from adarag.schema import GenerationParams

    config = tiny_config(tiny_checkpoints["llama"])
    engine = Engine.load(config.engine, config.kernels, config.home)
    runner = BenchRunner(
        engine, config, tmp_path / "bench", GenerationParams(max_new_tokens=2), True
    )
    turns, turn_stream = multi_turn_workload(data_dir, 2, top_k=3, seed=1)
    runner.ingest(turns)
    records = runner.run(POLICIES["ragboost"], turns, turn_stream, top_k=3)
    assert [r.position for r in records] == list(range(len(turn_stream)))  # turns in order
    follow_ups = records[2:]  # the second turns of both conversations
    assert all(r.tier_hits.get("hard", 0) >= 1 for r in follow_ups)  # earlier context reused
    assert set(runner.logits["ragboost"]) == set(range(len(turn_stream)))
    users, user_stream = multi_user_workload(data_dir, 4, 2, 6, seed=5)
    records = runner.run(POLICIES["ragboost"], users, user_stream, top_k=6)
    assert sorted(r.position for r in records) == list(range(len(user_stream)))
