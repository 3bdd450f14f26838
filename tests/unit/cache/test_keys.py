"""Cache keys: content hashes and prefix chains."""

from __future__ import annotations

from adarag.cache.keys import chunk_key, prompt_keys, system_key

A, B, C, D = (1, 2, 3), (4, 5), (6, 7, 8, 9), (10,)


def test_chunk_key_depends_on_model_and_system_prefix():
    root = system_key("model-a", [1, 2])
    assert chunk_key(root, A) == chunk_key(system_key("model-a", [1, 2]), A)
    assert chunk_key(root, A) != chunk_key(system_key("model-b", [1, 2]), A)
    assert chunk_key(root, A) != chunk_key(system_key("model-a", [1, 3]), A)
    assert chunk_key(root, A) != chunk_key(root, B)


def test_hard_keys_chain_the_whole_prefix():
    root = system_key("m", [0])
    first = prompt_keys(root, [A, B, C], None)
    assert prompt_keys(root, [A, B, C], None).hard == first.hard
    changed = prompt_keys(root, [D, B, C], None)
    assert all(x != y for x, y in zip(first.hard, changed.hard, strict=True))
    assert prompt_keys(root, [A, B], None).hard == first.hard[:2]


def test_soft_key_is_the_effective_prefix_and_the_chunk():
    root = system_key("m", [0])
    with_sink = prompt_keys(root, [A, B, C, D], sink_chunk_idx=0)
    # D after C with the same sink A, at another position and after other chunks: same soft key
    moved = prompt_keys(root, [A, D, B, C, D], sink_chunk_idx=0)
    assert with_sink.soft[3] == prompt_keys(root, [A, C, D], sink_chunk_idx=0).soft[2]
    assert moved.soft[4] == with_sink.soft[3]
    # another sink chunk: a different soft key; without a sink only the predecessor counts
    assert prompt_keys(root, [B, A, C, D], sink_chunk_idx=0).soft[3] != with_sink.soft[3]
    no_sink = prompt_keys(root, [A, B, C, D], sink_chunk_idx=None)
    assert no_sink.soft[3] == prompt_keys(root, [B, C, D], sink_chunk_idx=None).soft[2]


def test_independent_key_ignores_position_and_alone_key_is_the_first_hard_key():
    root = system_key("m", [0])
    keys = prompt_keys(root, [A, B], None)
    assert keys.independent[1] == prompt_keys(root, [C, D, B], None).independent[2]
    assert keys.alone[0] == keys.hard[0]
    assert prompt_keys(root, [B], None).hard[0] == keys.alone[1]
