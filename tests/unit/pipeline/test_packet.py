"""The profile's packet in the pipeline: which prompts carry the bridge, and which never do."""

from __future__ import annotations

import pytest
import torch

from adarag.config import RecomputeSettings
from adarag.engine.packet import packet_ids
from adarag.engine.prefill_request import PrefillRequest
from adarag.errors import ConfigError
from adarag.pipeline import AdaRAG
from adarag.pipeline.learned import learned_controls
from adarag.profiles import generic_profile
from adarag.schema import GenerationParams
from tests.unit.engine.helpers import CHUNKS, QUESTION
from tests.unit.pipeline.packet_profile import ASKED, with_packet

PARAMS = GenerationParams(max_new_tokens=6)
AUTO = RecomputeSettings(packet="auto")
"""The packet is off by default; these tests ask for it as a user would."""


@pytest.fixture()
def rag(tiny_checkpoints, tiny_config):
    return AdaRAG(tiny_config(tiny_checkpoints["llama"], cache=ASKED))


def _answer(rag: AdaRAG) -> str:
    return rag.query(QUESTION, chunks=list(CHUNKS), params=PARAMS).text


def test_reused_chunks_carry_the_bridge_and_off_answers_as_without_it(rag):
    with_packet(rag)
    rag.warm(list(CHUNKS))  # independent entries: reused at the tier's ratio
    layout = rag.prompts.layout(QUESTION, CHUNKS)
    prefilled = rag.augmentation.looked_up_prefill(layout, PARAMS.max_new_tokens)
    assert "independent" in {hit.tier for hit in prefilled.hits}  # the first chunk is hard
    bridge = packet_ids(rag.engine.spec.vocab_size, 4)
    assert prefilled.layout.query_ids == (*bridge, *layout.query_ids)
    off = rag.with_config(cache={"recompute": {"packet": "off"}})
    plain = off.augmentation.looked_up_prefill(layout, PARAMS.max_new_tokens)
    assert plain.layout == layout
    assert not torch.allclose(prefilled.output.logits, plain.output.logits)  # it changes things


def test_ratio_one_and_hard_replays_never_carry_the_bridge(tiny_checkpoints, tiny_config):
    everything = {
        "independent": {"recompute_ratio": 1.0},
        "soft": {"recompute_ratio": 1.0},
        **ASKED,
    }
    rag = AdaRAG(tiny_config(tiny_checkpoints["llama"], cache=everything))
    with_packet(rag)
    rag.warm(list(CHUNKS))
    layout = rag.prompts.layout(QUESTION, CHUNKS)
    first = rag.augmentation.looked_up_prefill(layout, 0)
    assert first.layout == layout  # every reused chunk recomputed: its context is its own
    rag.augmentation.write_back(first.layout, first.output, first.hits)
    replay = rag.augmentation.looked_up_prefill(layout, 0)
    assert {hit.tier for hit in replay.hits} == {"hard"} and replay.layout == layout


def test_ratio_one_with_the_default_store_equals_full_prefill(tiny_checkpoints, tiny_config):
    """The stored (bfloat16) system prefix is not what a ratio-1.0 prompt reuses."""
    everything = {"independent": {"recompute_ratio": 1.0}, "soft": {"recompute_ratio": 1.0}}
    config = tiny_config(tiny_checkpoints["llama"], cache=everything)
    assert config.cache.store.storage_dtype == "bfloat16"
    layout = None
    for _ in range(2):  # then restarted: the stored prefix is there, and not what is reused
        rag = AdaRAG(config)
        layout = rag.prompts.layout(QUESTION, CHUNKS[:2])
        output, hits, _ = rag.augmentation.fused_prefill(layout, PARAMS.max_new_tokens)
        assert {hit.tier for hit in hits} == {"miss"}
        full = rag.engine.prefill(PrefillRequest(layout, max_new_tokens=PARAMS.max_new_tokens))
        torch.testing.assert_close(output.logits, full.logits, atol=1e-5, rtol=1e-5)
        assert list(rag.engine.decode_tokens(layout, output, PARAMS)) == list(
            rag.engine.decode_tokens(layout, full, PARAMS)
        )


def test_an_altered_or_missing_packet_file_is_refused_naming_the_fix(tiny_checkpoints, tiny_config):
    rag = AdaRAG(tiny_config(tiny_checkpoints["llama"]))
    data = with_packet(rag)
    directory = rag.config.home / "profiles"
    (packet,) = directory.glob("*.safetensors")
    packet.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(ConfigError, match="does not hold the packet.*calibrate --packet"):
        _ = AdaRAG(rag.config).profile
    packet.unlink()
    with pytest.raises(ConfigError, match="not beside it"):
        _ = AdaRAG(rag.config).profile


def test_packet_on_needs_a_packet_and_the_torch_engine(rag):
    profile = generic_profile("m", "f" * 16, 2)
    with pytest.raises(ConfigError, match="has no packet"):
        learned_controls(RecomputeSettings(packet="on"), profile)
    assert learned_controls(AUTO, profile).packet is None  # auto: quietly none
    with_packet(rag)
    fitted = rag.profile
    with pytest.raises(ConfigError, match="torch engine"):
        learned_controls(RecomputeSettings(packet="on"), fitted, backend="vllm")
    assert learned_controls(AUTO, fitted, backend="vllm").packet is None
    assert learned_controls(AUTO, fitted).packet is not None
    assert learned_controls(RecomputeSettings(), fitted).packet is None  # off by default


def test_trailed_entries_are_bound_to_their_packet_and_another_one_recomputes(
    tiny_checkpoints, tiny_config
):
    config = tiny_config(tiny_checkpoints["llama"], cache=ASKED)
    rag = AdaRAG(config)
    with_packet(rag, rows=0, trailer=2)
    rag = AdaRAG(config)  # reads the new profile
    assert rag.warm(list(CHUNKS)) == len(CHUNKS)
    layout = rag.prompts.layout(QUESTION, CHUNKS)
    prefilled = rag.augmentation.looked_up_prefill(layout, 0)
    ids = packet_ids(rag.engine.spec.vocab_size, 2)
    assert all(chunk[-2:] == ids for chunk in prefilled.layout.chunk_ids)
    assert prefilled.layout.query_ids == layout.query_ids  # no bridge in this packet
    assert {hit.tier for hit in prefilled.hits} == {"hard", "independent"}  # warmed with it
    first_namespace = rag.kv_namespace
    assert "-packet" in first_namespace
    assert AdaRAG(config).warm(list(CHUNKS)) == 0  # the same packet: its entries are found

    with_packet(rag, rows=0, trailer=2)  # a new fit: other rows, another digest
    refitted = AdaRAG(config)
    assert refitted.kv_namespace != first_namespace
    stale = refitted.augmentation.looked_up_prefill(layout, 0)
    assert {hit.tier for hit in stale.hits} == {"miss"}  # computed again, never mixed
    assert refitted.warm(list(CHUNKS)) == len(CHUNKS)
