"""The context index and the batch scheduler (RAGBoost sections 4 and 5.2), in plain Python."""

from __future__ import annotations

import itertools

from adarag.cache.context_index import ContextIndex, schedule_contexts


def _hard(path):
    return ["/".join(path[: i + 1]) for i in range(len(path))]


def _cached_run(order, chunks, cached):
    """Leading chunks of ``order`` whose hard key (the path so far) is cached."""
    count = 0
    for i in range(len(order)):
        if "/".join(chunks[j] for j in order[: i + 1]) not in cached:
            break
        count += 1
    return count


def test_the_longest_cached_prefix_beats_every_other_order():
    index = ContextIndex()
    written = [["a", "b", "c"], ["a", "d"], ["e", "b", "f", "g"], ["b"]]
    cached = set()
    for path in written:
        index.insert(path, _hard(path))
        cached.update(_hard(path))
    request = ["g", "f", "b", "a", "e"]
    match = index.longest_prefix(request, cached.__contains__)
    best = max(
        _cached_run(order, request, cached) for order in itertools.permutations(range(len(request)))
    )
    assert match.num_cached == best == 4  # e, b, f, g
    assert [request[i] for i in match.order] == ["e", "b", "f", "g", "a"]
    assert sorted(match.order) == list(range(len(request)))  # every chunk listed once


def test_an_evicted_entry_is_pruned_and_never_claimed():
    index = ContextIndex()
    index.insert(["a", "b"], _hard(["a", "b"]))
    index.insert(["c"], _hard(["c"]))
    cached = {"a", "c"}  # a/b was evicted
    match = index.longest_prefix(["b", "a", "c"], cached.__contains__)
    assert match.num_cached == 1
    assert len(index) == 2  # a/b is gone, a and c stay


def test_a_request_sharing_nothing_keeps_the_retriever_order():
    index = ContextIndex()
    index.insert(["a"], ["a"])
    match = index.longest_prefix(["x", "y", "z"], lambda key: True)
    assert match.order == (0, 1, 2)
    assert match.num_cached == 0


def test_planned_paths_order_uncached_chunks_but_do_not_count_as_cached():
    index = ContextIndex()
    index.insert(["b", "a"], _hard(["b", "a"]), planned=True)
    match = index.longest_prefix(["a", "x", "b"], lambda key: False)
    assert [["a", "x", "b"][i] for i in match.order] == ["b", "a", "x"]
    assert match.num_cached == 0


def test_the_scheduler_puts_prefix_sharing_requests_back_to_back():
    contexts = [
        ["a", "b", "c"],  # 0: shares a, b with 2 and 4
        ["x", "y", "z"],  # 1: shares x with 3
        ["b", "a", "d"],  # 2
        ["w", "x", "v"],  # 3
        ["e", "a", "b"],  # 4
        ["q", "r", "s"],  # 5: shares nothing
    ]
    plan = schedule_contexts(contexts)
    assert sorted(plan.order) == list(range(len(contexts)))
    position = {request: at for at, request in enumerate(plan.order)}
    group = sorted(position[r] for r in (0, 2, 4))
    assert group == list(range(group[0], group[0] + 3))  # contiguous
    assert abs(position[1] - position[3]) == 1
    assert plan.order[:3] == (0, 2, 4)  # the largest group first
    # the group's requests list their shared chunks first, in one order
    heads = {tuple(contexts[r][i] for i in plan.chunk_orders[r][:2]) for r in (0, 2, 4)}
    assert len(heads) == 1 and set(heads.pop()) == {"a", "b"}
    for request, order in enumerate(plan.chunk_orders):
        assert sorted(order) == list(range(len(contexts[request])))
    assert schedule_contexts(contexts) == plan  # deterministic
