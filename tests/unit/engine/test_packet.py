"""Packet tokens: embedded from the request's table, and the student's tail forward is exact."""

from __future__ import annotations

import pytest
import torch

from adarag.engine.packet import packet_ids
from adarag.engine.packet_student import FreshRows, context_copy, tail_logits, tail_rows
from adarag.engine.prefill_request import LearnedControls, PrefillRequest
from adarag.errors import InputError
from adarag.evaluation.reuse import reuse_sources
from tests.unit.engine.helpers import CHUNKS, QUESTION, independent_sources, layout_of
from tests.unit.engine.test_fusion import _engine


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_tail_over_a_full_prefill_gives_the_full_prefills_logits(
    tiny_checkpoints, tiny_config, family
):
    engine = _engine(tiny_checkpoints, tiny_config, family)
    layout = layout_of(engine, QUESTION, CHUNKS)
    full = engine.prefill(PrefillRequest(layout))
    cut = layout.cu_segments[-2]  # the query suffix runs as the tail
    head = engine.prefill(PrefillRequest(layout, None)).kv
    tail = torch.tensor(layout.query_ids)
    logits = tail_logits(engine.runner, context_copy(head, cut), cut, tail)
    torch.testing.assert_close(logits[-1], full.logits, atol=1e-4, rtol=1e-4)


def test_packet_rows_stand_in_for_their_ids_and_carry_the_gradient(tiny_checkpoints, tiny_config):
    engine = _engine(tiny_checkpoints, tiny_config)
    spec = engine.spec
    layout = layout_of(engine, QUESTION, CHUNKS)
    table = torch.randn(3, spec.hidden_size) * 0.02
    ids = packet_ids(spec.vocab_size, 3)
    bridged = layout.with_bridge(ids)
    sources, _, _ = independent_sources(engine, bridged, 0.0)
    fused = engine.prefill(PrefillRequest(bridged, sources, controls=LearnedControls(packet=table)))
    plain = engine.prefill(PrefillRequest(layout, independent_sources(engine, layout, 0.0)[0]))
    assert not torch.allclose(fused.logits, plain.logits)  # the packet changed the answer
    cut = bridged.cu_segments[-2]
    packet = table.clone().requires_grad_(True)
    logits = tail_logits(
        engine.runner, context_copy(fused.kv, cut), cut, torch.tensor(bridged.query_ids), packet
    )
    torch.testing.assert_close(logits[-1].detach(), fused.logits, atol=1e-4, rtol=1e-4)
    logits[-1].logsumexp(-1).backward()
    assert packet.grad is not None and float(packet.grad.abs().sum()) > 0.0
    with pytest.raises(InputError, match="packet table"):
        engine.prefill(PrefillRequest(bridged, sources))  # packet ids without their table


def test_a_trailers_rows_reused_in_a_fused_prefill_carry_the_gradient(
    tiny_checkpoints, tiny_config
):
    engine = _engine(tiny_checkpoints, tiny_config)
    spec = engine.spec
    table = torch.randn(2, spec.hidden_size) * 0.02
    trailer = packet_ids(spec.vocab_size, 2)
    plain = layout_of(engine, QUESTION, CHUNKS)
    layout = plain.with_trailers(trailer)
    assert all(ids[-2:] == trailer for ids in layout.chunk_ids)
    _, _, system_kv = independent_sources(engine, plain, 0.0)
    packet = table.clone().requires_grad_(True)
    entries, rows = [], []
    for ids in plain.chunk_ids:
        alone = engine.compute_chunk(plain.system_ids, ids, system_kv)
        context = engine.runner.new_cache(system_kv.num_tokens + alone.num_tokens)
        context.load(0, system_kv, engine.runner.inv_freq)
        context.load(system_kv.num_tokens, alone, engine.runner.inv_freq)
        fresh = tail_rows(engine.runner, context, context.capacity, torch.tensor(trailer), packet)
        # the student's trailer rows are what warming stores: the chunk computed with them
        stored = engine.compute_chunk(plain.system_ids, (*ids, *trailer), system_kv, packet=table)
        torch.testing.assert_close(fresh.k.detach(), stored.k[:, -2:], atol=1e-5, rtol=1e-5)
        entries.append(stored)
        rows.append(fresh)
    sources = reuse_sources(system_kv, entries, 0.0)
    fused = engine.prefill(PrefillRequest(layout, sources, controls=LearnedControls(packet=table)))
    cu = layout.cu_segments
    moved = [
        row.moved(torch.arange(cu[idx + 2] - 2, cu[idx + 2]), engine.runner.inv_freq)
        for idx, row in enumerate(rows)
    ]
    fresh = FreshRows.joined(moved)
    cut = cu[-2]
    logits = tail_logits(
        engine.runner,
        context_copy(fused.kv, cut),
        cut,
        torch.tensor(layout.query_ids),
        packet,
        fresh,
    )
    torch.testing.assert_close(logits[-1].detach(), fused.logits, atol=1e-4, rtol=1e-4)
    logits[-1].logsumexp(-1).backward()
    assert packet.grad is not None and float(packet.grad.abs().sum()) > 0.0


def test_a_replacing_bridge_stands_in_only_for_the_ids_it_was_fitted_on():
    from adarag.engine.batch import SegmentSource
    from adarag.kv import ChunkKV
    from adarag.schema import PromptLayout

    kv = ChunkKV(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4), 0)
    reused = [SegmentSource(kv, exact=True), SegmentSource(kv, 0.2), SegmentSource()]
    controls = LearnedControls(packet=torch.zeros(2, 4), bridge_tokens=2, bridge_replaces=(7, 8))
    layout = PromptLayout((1, 2), ((3, 4),), (7, 8, 9, 10))
    bridged = controls.bridged(layout, reused, vocab_size=100)
    assert bridged.query_ids == (*packet_ids(100, 2), 9, 10)
    assert bridged.chunk_ids == layout.chunk_ids
    # another template's query: no bridge rather than a wrong one
    other = PromptLayout((1, 2), ((3, 4),), (5, 8, 9, 10))
    assert controls.bridged(other, reused, vocab_size=100) == other
    # a prompt of exact KV only never carries it
    exact = [SegmentSource(kv, exact=True), SegmentSource(kv, exact=True), SegmentSource()]
    assert controls.bridged(layout, exact, vocab_size=100) == layout
