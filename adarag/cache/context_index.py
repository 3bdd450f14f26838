"""The context index (RAGBoost section 4): a tree of chunk sequences the hard tier holds.

Each node below the root is one chunk after the chunks of its ancestors; its hard key is the KV
of that chunk computed after exactly that prefix. The tree mirrors the hard tier: every prompt
written back adds its path, and a node whose entry the store no longer holds (evicted) is pruned
when a search meets it, so the tree never claims a prefix the store cannot serve. A *planned*
path (from :func:`schedule_contexts`) is kept before it is cached, so the requests of a batch
agree on one order for the documents they share.

:meth:`ContextIndex.longest_prefix` answers RAGBoost's question "which order of this request's
chunks starts with the longest cached prefix?": a depth-first walk over the children that are
among the request's chunks, so every node is visited at most once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass
class _Node:
    hard_key: str
    planned: bool = False
    children: dict[str, _Node] = field(default_factory=dict)


@dataclass(frozen=True)
class PrefixMatch:
    """The best order found for a request's chunks.

    Attributes:
        order: Indices into the request's chunks: the matched path, then the rest in the
            request's own order.
        num_cached: How many leading chunks of ``order`` the hard tier holds.
    """

    order: tuple[int, ...]
    num_cached: int


class ContextIndex:
    """Chunk-key sequences cached (or planned) in the hard tier, as a tree."""

    def __init__(self) -> None:
        self._root = _Node("")

    def __len__(self) -> int:
        """Nodes below the root."""
        count, stack = 0, [self._root]
        while stack:
            node = stack.pop()
            count += len(node.children)
            stack.extend(node.children.values())
        return count

    def insert(
        self, chunk_keys: Sequence[str], hard_keys: Sequence[str], *, planned: bool = False
    ) -> None:
        """Record the path ``chunk_keys`` (``hard_keys[i]``: the hard key of chunk ``i``).

        A written path (``planned=False``) clears the planned mark of the nodes it passes.
        """
        node = self._root
        for chunk, hard in zip(chunk_keys, hard_keys, strict=True):
            child = node.children.get(chunk)
            if child is None:
                child = node.children[chunk] = _Node(hard, planned=planned)
            elif not planned:
                child.planned = False
            node = child

    def longest_prefix(
        self, chunk_keys: Sequence[str], is_cached: Callable[[str], bool]
    ) -> PrefixMatch:
        """The order of ``chunk_keys`` whose leading chunks the hard tier holds most of.

        Ties (and the uncached rest of a path) follow planned paths, then the request's order.

        Args:
            chunk_keys: The request's chunk keys in the retriever's order.
            is_cached: Whether the store holds a hard key; a written node it does not hold is
                pruned (its entry was evicted), with the subtree below it.
        """
        position: dict[str, int] = {}
        for idx, key in enumerate(chunk_keys):
            position.setdefault(key, idx)
        best: tuple[tuple[int, int], list[int]] = ((0, 0), [])
        stack: list[tuple[_Node, list[int], int]] = [(self._root, [], 0)]
        while stack:
            node, path, num_cached = stack.pop()
            if (num_cached, len(path)) > best[0]:
                best = ((num_cached, len(path)), path)
            children = list(node.children.items())
            for key, child in reversed(children):  # first-inserted child explored first
                at = position.get(key)
                if at is None or at in path:
                    continue
                cached = num_cached == len(path) and is_cached(child.hard_key)
                if not cached and not child.planned:
                    if num_cached == len(path):  # evicted: mirror the store
                        del node.children[key]
                    continue
                stack.append((child, [*path, at], num_cached + int(cached)))
        (num_cached, _), path = best
        taken = set(path)
        rest = [idx for idx in range(len(chunk_keys)) if idx not in taken]
        return PrefixMatch(tuple(path + rest), num_cached)


@dataclass(frozen=True)
class BatchPlan:
    """Which order to run a batch of requests in, and each request's chunk order.

    Attributes:
        order: Request indices, prefix-sharing requests back to back.
        chunk_orders: Per request (by its index), indices into its chunks: the prefix it shares
            with its group, then its other chunks in the retriever's order.
    """

    order: tuple[int, ...]
    chunk_orders: tuple[tuple[int, ...], ...]


def schedule_contexts(contexts: Sequence[Sequence[str]]) -> BatchPlan:
    """Group a batch's requests by the chunks they share (RAGBoost sections 4.1 and 5.2).

    The chunk shared by the most requests opens a group of those requests (a tree node); inside
    it the next most shared chunk opens a subgroup, and so on while at least two requests share
    one. Groups run largest first, each group's requests back to back, and every request lists
    its group's shared chunks first in one order, so each request after the first finds them
    cached as a prefix. Ties go to the chunk seen first, so the plan is deterministic.

    Args:
        contexts: Each request's chunk keys (or any hashable ids), in the retriever's order.
    """
    chunk_orders: list[tuple[int, ...]] = [() for _ in contexts]

    def group(members: list[int], prefix: list[str]) -> list[int]:
        shared = set(prefix)
        counts: Counter[str] = Counter()
        first_seen: dict[str, int] = {}
        for request in members:
            for chunk in dict.fromkeys(contexts[request]):
                if chunk not in shared:
                    counts[chunk] += 1
                    first_seen.setdefault(chunk, len(first_seen))
        top = max(counts.items(), key=lambda item: (item[1], -first_seen[item[0]]), default=None)
        if top is None or top[1] < 2:
            for request in members:
                chunks = contexts[request]
                head = [chunks.index(chunk) for chunk in prefix]
                rest = [idx for idx in range(len(chunks)) if idx not in head]
                chunk_orders[request] = tuple(head + rest)
            return members
        chunk = top[0]
        with_chunk = [request for request in members if chunk in contexts[request]]
        without = [request for request in members if chunk not in contexts[request]]
        ordered = group(with_chunk, [*prefix, chunk])
        return ordered + (group(without, prefix) if without else [])

    order = group(list(range(len(contexts))), []) if contexts else []
    return BatchPlan(tuple(order), tuple(chunk_orders))
