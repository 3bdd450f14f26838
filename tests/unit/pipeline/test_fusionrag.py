"""FusionRAG: fused chunk KV at warm, the alternative path, final-layer query selection."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from adarag.cache.keys import fused_key
from adarag.engine.query_pass import query_layers
from adarag.pipeline import AdaRAG
from adarag.policies import POLICIES
from adarag.retrievers.memory import MemoryRetriever
from adarag.schema import Chunk
from tests.tiny_models import load_hf_model
from tests.unit.engine.helpers import CHUNKS, QUESTION

EXTRA = "the lazy dog sleeps by the quick river in paris."
CORPUS = [*CHUNKS, EXTRA]
FLOAT32 = {"storage_dtype": "float32"}


def _fusion_rag(tiny_checkpoints, tiny_config, num_neighbors=2, fusion=None, **cache):
    fused = {"enabled": True, "num_neighbors": num_neighbors, **(fusion or {})}
    config = tiny_config(
        tiny_checkpoints["llama"],
        cache={"store": FLOAT32, **cache},
        experimental={"fusion": fused},
    )
    return AdaRAG(config, retriever=MemoryRetriever([Chunk(text) for text in CORPUS]))


def _hf_kv(hf_model, cache: DynamicCache, token_ids, start: int) -> DynamicCache:
    """``cache`` extended by HF's forward of ``token_ids`` at positions ``start..``."""
    positions = torch.arange(start, start + len(token_ids))[None]
    with torch.inference_mode():
        hf_model(torch.tensor([list(token_ids)]), past_key_values=cache, position_ids=positions)
    return cache


def _rows(cache: DynamicCache, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``start..end`` of an HF cache as our layout, [layers, tokens, heads, dim]."""
    keys = torch.stack([layer.keys[0, :, start:end].transpose(0, 1) for layer in cache.layers])
    values = torch.stack([layer.values[0, :, start:end].transpose(0, 1) for layer in cache.layers])
    return keys, values


def _rotate(hf_model, keys: torch.Tensor, delta: int) -> torch.Tensor:
    """Keys [layers, tokens, heads, dim] moved ``delta`` positions by HF's own rotary code."""
    num_tokens = keys.shape[1]
    positions = torch.full((1, num_tokens), delta)
    cos, sin = hf_model.model.rotary_emb(keys, positions)
    moved = []
    for layer_keys in keys:  # [tokens, heads, dim] -> HF's [1, heads, tokens, dim]
        as_hf = layer_keys.transpose(0, 1)[None]
        _, rotated = apply_rotary_pos_emb(as_hf, as_hf, cos, sin)
        moved.append(rotated[0].transpose(0, 1))
    return torch.stack(moved)


def test_fused_kv_is_a_prefill_after_the_similar_chunks_not_the_independent_kv(
    tiny_checkpoints, tiny_config
):
    rag = _fusion_rag(tiny_checkpoints, tiny_config)
    rag.warm(CORPUS)
    chunk = CHUNKS[0]
    hits = MemoryRetriever([Chunk(text) for text in CORPUS]).retrieve(chunk, 3)
    neighbours = [hit.text for hit in hits if hit.text != chunk][:2]
    assert len(neighbours) == 2
    prompts, cache = rag.prompts, rag.cache
    ids = prompts.chunk_ids(chunk)
    stored = cache.store.get(fused_key(cache.root, cache.keys([ids]).chunks[0]))
    assert stored is not None
    # reference with transformers: the system prefix, then each neighbour's KV computed alone
    # after it and moved (HF's rotary) to consecutive positions, then the chunk computed in full
    hf_model = load_hf_model(tiny_checkpoints["llama"])
    system = prompts.system_ids
    reference = _hf_kv(hf_model, DynamicCache(), system, 0)
    position = len(system)
    for text in neighbours:
        neighbour = prompts.chunk_ids(text)
        system_cache = _hf_kv(hf_model, DynamicCache(), system, 0)
        alone = _hf_kv(hf_model, system_cache, neighbour, len(system))
        keys, values = _rows(alone, len(system), len(system) + len(neighbour))
        keys = _rotate(hf_model, keys, position - len(system))
        for layer_idx in range(keys.shape[0]):
            reference.update(
                keys[layer_idx].transpose(0, 1)[None],
                values[layer_idx].transpose(0, 1)[None],
                layer_idx,
            )
        position += len(neighbour)
    _hf_kv(hf_model, reference, ids, position)
    keys, values = _rows(reference, position, position + len(ids))
    assert stored.start_position == position
    torch.testing.assert_close(stored.k, keys, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(stored.v, values, atol=1e-4, rtol=1e-4)
    independent = cache.independent_kv(ids)
    assert independent is not None
    # the independent KV sits at another position: compare values, and keys moved there
    assert (stored.v[1:] - independent.v[1:]).abs().max() > 1e-2
    moved = _rotate(hf_model, independent.k, position - independent.start_position)
    assert (stored.k[1:] - moved[1:]).abs().max() > 1e-2
    # the first layer's K/V depend only on the token and its position: equal once re-rotated
    torch.testing.assert_close(stored.k[0], moved[0], atol=1e-4, rtol=1e-4)


def test_a_fused_hit_replaces_the_independent_one(tiny_checkpoints, tiny_config):
    rag = _fusion_rag(tiny_checkpoints, tiny_config, hard={"enabled": False})
    assert rag.warm(CORPUS) == len(CORPUS)
    assert rag.warm(CORPUS) == 0  # nothing left to compute
    layout = rag.prompts.layout(QUESTION, [CHUNKS[1], CHUNKS[0]])
    _, hits, _ = rag.augmentation.fused_prefill(layout, 0)
    assert [hit.tier for hit in hits] == ["fused", "fused"]
    plain = AdaRAG(rag.config.model_copy(update={"home": rag.config.home / "plain"}))
    plain = plain.with_config(experimental={"fusion": {"enabled": False}})
    plain.warm(CORPUS)
    _, hits, _ = plain.augmentation.fused_prefill(layout, 0)
    assert [hit.tier for hit in hits] == ["independent", "independent"]


def test_alternative_path_finds_a_chunk_stored_under_another_prefix(tiny_checkpoints, tiny_config):
    unseen = "an unseen chunk of text."
    first_chunks = [EXTRA, CHUNKS[0], CHUNKS[1]]
    second_chunks = [unseen, CHUNKS[0], CHUNKS[1]]
    tiers = {}
    for enabled in (True, False):
        # no soft tier: its key (the predecessor) would find CHUNKS[1] first
        cache = {"store": FLOAT32, "soft": {"enabled": False}}
        path = {"alternative_path": {"enabled": enabled}}
        config = tiny_config(tiny_checkpoints["llama"], cache=cache, experimental=path)
        rag = AdaRAG(config.model_copy(update={"home": config.home / str(enabled)}))
        first = rag.prompts.layout(QUESTION, first_chunks)
        output, hits, _ = rag.augmentation.fused_prefill(first, 0)
        rag.augmentation.write_back(first, output, hits)
        second = rag.prompts.layout(QUESTION, second_chunks)
        _, hits, _ = rag.augmentation.fused_prefill(second, 0)
        tiers[enabled] = [hit.tier for hit in hits]
        if enabled:
            # CHUNKS[1] comes back as computed after EXTRA, CHUNKS[0] in the first prompt
            stored = output.kv.segment(first.cu_segments[3], first.cu_segments[4])
            torch.testing.assert_close(hits[2].kv.k, stored.k)
            assert (
                hits[2].recompute_ratio == rag.config.experimental.alternative_path.recompute_ratio
            )
    assert tiers[True] == ["miss", "independent", "alternative"]
    assert tiers[False] == ["miss", "independent", "independent"]


def test_fusionrag_scores_with_the_final_layer_only(tiny_checkpoints, tiny_config):
    policy = POLICIES["fusionrag"]
    config = tiny_config(tiny_checkpoints["llama"], **policy.overrides)
    rag = AdaRAG(config, retriever=MemoryRetriever([Chunk(text) for text in CORPUS]))
    num_layers = rag.engine.spec.num_layers
    assert query_layers(config.selection, num_layers) == (num_layers - 1, num_layers)


@pytest.mark.parametrize("other", ["cacheblend", "adacache-static"])
def test_fusionrag_computes_something_else_than(other, tiny_checkpoints, tiny_config):
    layout_chunks = [CHUNKS[2], CHUNKS[0], CHUNKS[1]]
    outputs = {}
    for name in ("fusionrag", other):
        config = tiny_config(tiny_checkpoints["llama"], **POLICIES[name].overrides)
        config = config.model_copy(update={"home": config.home / name})
        rag = AdaRAG(config, retriever=MemoryRetriever([Chunk(text) for text in CORPUS]))
        rag.warm(CORPUS)
        layout = rag.prompts.layout(QUESTION, layout_chunks)
        outputs[name] = rag.augmentation.fused_prefill(layout, 0)
    (fusion, fusion_hits, _), (baseline, baseline_hits, _) = outputs["fusionrag"], outputs[other]
    # the first chunk may be an exact (hard) hit: its warm KV is the one-chunk prompt's
    assert [hit.tier for hit in fusion_hits[1:]] == ["fused"] * 2
    assert [hit.tier for hit in baseline_hits[1:]] == ["independent"] * 2
    differs = not torch.equal(fusion.recomputed_positions, baseline.recomputed_positions)
    assert differs or not torch.allclose(fusion.logits, baseline.logits)
    rows = slice(layout.cu_segments[2], layout.num_tokens)
    assert not torch.allclose(fusion.kv.v[1, rows], baseline.kv.v[1, rows])


def test_a_fused_entry_is_reused_only_with_its_neighbours_in_the_prompt(
    tiny_checkpoints, tiny_config
):
    fusion = {"enabled": True, "num_neighbors": 2, "min_neighbors_in_prompt": 1}
    rag = _fusion_rag(tiny_checkpoints, tiny_config, hard={"enabled": False}, fusion=fusion)
    rag.warm(CORPUS)
    finder = MemoryRetriever([Chunk(text) for text in CORPUS])

    def neighbours(text: str) -> set[str]:
        return {hit.text for hit in finder.retrieve(text, 3) if hit.text != text}

    def tiers(rag: AdaRAG, chunks: list[str]) -> list[str]:
        _, hits, _ = rag.augmentation.fused_prefill(rag.prompts.layout(QUESTION, chunks), 0)
        return [hit.tier for hit in hits]

    prompts = [[CHUNKS[0], CHUNKS[1]], [CHUNKS[0], CHUNKS[2]], [CHUNKS[0]]]
    expected = [
        ["fused" if neighbours(text) & (set(chunks) - {text}) else "independent" for text in chunks]
        for chunks in prompts
    ]
    assert expected[0] == ["fused", "fused"] and expected[1] == ["independent", "independent"]
    assert [tiers(rag, chunks) for chunks in prompts] == expected
    # the neighbour keys are stored with the entries: they survive a restart
    restarted = AdaRAG(rag.config, retriever=finder)
    assert [tiers(restarted, chunks) for chunks in prompts] == expected
    # no gate: the fused entry always; a gate no chunk passes (3 of 2 neighbours): never
    always = restarted.with_config(
        experimental={"fusion": {**fusion, "min_neighbors_in_prompt": 0}}
    )
    assert tiers(always, prompts[1]) == ["fused", "fused"]
    never = restarted.with_config(experimental={"fusion": {**fusion, "min_neighbors_in_prompt": 3}})
    assert tiers(never, prompts[0]) == ["independent", "independent"]
