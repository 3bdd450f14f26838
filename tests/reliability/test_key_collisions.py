"""Keys are length-prefixed hash chains: no two different segment sequences share a key."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from adarag.cache.keys import digest, prompt_keys, system_key

ROOT = system_key("model-float32-float32", [1, 2, 3])
token_ids = st.lists(st.integers(min_value=0, max_value=2**31 - 1), min_size=1, max_size=12)
segments = st.lists(token_ids, min_size=1, max_size=5)


def test_moving_a_boundary_between_parts_changes_the_digest():
    assert digest("ab", "c") != digest("a", "bc")
    assert digest(b"\x00", b"") != digest(b"", b"\x00")
    first = prompt_keys(ROOT, [[1, 2], [3]], None)
    second = prompt_keys(ROOT, [[1], [2, 3]], None)
    assert first.hard[-1] != second.hard[-1]  # the same tokens, split differently


@given(segments, segments)
def test_different_segment_sequences_never_share_a_key(ledger, first, second):
    if first == second:
        return
    a, b = prompt_keys(ROOT, first, 0), prompt_keys(ROOT, second, 0)
    assert a.hard[-1] != b.hard[-1]  # the exact prefix of the last chunk differs
    for idx in range(min(len(first), len(second))):
        if first[idx] != second[idx]:
            assert a.chunks[idx] != b.chunks[idx] and a.independent[idx] != b.independent[idx]
        if first[: idx + 1] != second[: idx + 1]:
            assert a.hard[idx] != b.hard[idx]
    ledger.record("key collisions (distinct segment sequences)", cases=1)
