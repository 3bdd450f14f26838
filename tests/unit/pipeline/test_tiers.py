"""Tier lookup, write-back and reuse with a real (tiny) engine."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from adarag.cache.disk import SUFFIX
from adarag.config import AdaRagConfig
from adarag.engine.prefill_request import PrefillRequest
from adarag.pipeline import AdaRAG
from tests.unit.engine.helpers import CHUNKS, QUESTION

EXTRA = "the lazy dog sleeps by the quick river in paris."


@pytest.fixture()
def rag(tiny_checkpoints, tiny_config):
    exact = {"store": {"storage_dtype": "float32"}}  # a hard hit is then the stored prefill
    return AdaRAG(tiny_config(tiny_checkpoints["llama"], cache=exact))


def _full_logits(rag, layout):
    return rag.engine.prefill(PrefillRequest(layout)).logits


def test_identical_prompt_from_hard_tier_reproduces_full_prefill_logits(rag):
    layout = rag.prompts.layout(QUESTION, CHUNKS)
    output, hits, _ = rag.augmentation.fused_prefill(layout, max_new_tokens=0)
    assert [hit.tier for hit in hits] == ["miss"] * 3
    rag.augmentation.write_back(layout, output, hits)
    again, hits, _ = rag.augmentation.fused_prefill(layout, max_new_tokens=0)
    assert [hit.tier for hit in hits] == ["hard"] * 3
    # equal up to fp32 rounding of the query rows (masked blocks vs one causal kernel call)
    torch.testing.assert_close(again.logits, _full_logits(rag, layout), atol=1e-5, rtol=1e-5)
    assert again.num_recomputed_tokens == len(layout.query_ids)


def test_tiers_are_chosen_in_order_of_accuracy(rag):
    prompts = rag.prompts
    first = prompts.layout(QUESTION, CHUNKS)
    output, hits, _ = rag.augmentation.fused_prefill(first, 0)
    rag.augmentation.write_back(first, output, hits)
    rag.warm([EXTRA])
    # chunk 0 again first (hard); chunk 1 after the same predecessor but a new prefix (soft,
    # there is no sink chunk in the generic profile); EXTRA was only warmed (independent);
    # a new text misses.
    second = prompts.layout(QUESTION, [CHUNKS[0], CHUNKS[1], EXTRA, "an unseen chunk of text."])
    _, hits, _ = rag.augmentation.fused_prefill(second, 0)
    assert [hit.tier for hit in hits] == ["hard", "hard", "independent", "miss"]
    third = prompts.layout(QUESTION, [EXTRA, CHUNKS[0], CHUNKS[1]])
    _, hits, _ = rag.augmentation.fused_prefill(third, 0)
    assert [hit.tier for hit in hits] == ["hard", "independent", "soft"]
    ratios = rag.config.cache
    assert [hit.recompute_ratio for hit in hits] == [
        0.0,
        ratios.independent.recompute_ratio,
        ratios.soft.recompute_ratio,
    ]


def test_write_back_stores_hard_and_soft_keys(rag):
    layout = rag.prompts.layout(QUESTION, CHUNKS)
    output, hits, _ = rag.augmentation.fused_prefill(layout, 0)
    rag.augmentation.write_back(layout, output, hits)
    keys = rag.cache.keys(layout.chunk_ids)
    for idx in range(3):
        assert rag.cache.store.contains(keys.hard[idx])
        assert rag.cache.store.contains(keys.soft[idx])
        assert rag.cache.store.contains(keys.independent[idx])


def test_disabled_tiers_are_skipped(tiny_checkpoints, tiny_config):
    rag = AdaRAG(tiny_config(tiny_checkpoints["llama"], cache={"hard": {"enabled": False}}))
    layout = rag.prompts.layout(QUESTION, CHUNKS)
    output, hits, _ = rag.augmentation.fused_prefill(layout, 0)
    rag.augmentation.write_back(layout, output, hits)
    _, hits, _ = rag.augmentation.fused_prefill(layout, 0)
    assert [hit.tier for hit in hits] == ["soft"] * 3


@pytest.mark.slow
def test_a_second_process_reuses_chunk_kv_from_disk(tiny_checkpoints, tmp_path):
    script = textwrap.dedent(
        f"""
        import json
        from adarag import AdaRAG
        from adarag.config import AdaRagConfig
        from adarag.schema import GenerationParams
        config = AdaRagConfig.build(home={str(tmp_path)!r},
                                    engine={{"model": {str(tiny_checkpoints["llama"])!r}}},
                                    augment={{"enabled": False}},
                                    experimental={{"augment": {{"num_lens_layers": 2}}}})
        with AdaRAG(config) as rag:
            answer = rag.query({QUESTION!r}, chunks={list(CHUNKS)!r},
                               params=GenerationParams(max_new_tokens=4))
        print(json.dumps({{"tiers": answer.trace.steps[0].tiers,
                          "recomputed": answer.trace.num_recomputed_tokens,
                          "text": answer.text}}))
        """
    )

    def run() -> dict:
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, check=True
        )
        return json.loads(done.stdout.strip().splitlines()[-1])

    first, second = run(), run()
    assert first["tiers"] == ["miss"] * 3
    assert second["tiers"] == ["hard"] * 3
    layout_query = (
        AdaRAG(AdaRagConfig.build(home=tmp_path, engine={"model": str(tiny_checkpoints["llama"])}))
        .prompts.layout(QUESTION, CHUNKS)
        .query_ids
    )
    assert second["recomputed"] == len(layout_query)
    assert second["text"] == first["text"]


def test_corrupted_cache_file_is_recomputed_and_the_answer_still_comes(
    tiny_checkpoints, tiny_config, caplog
):
    rag = AdaRAG(tiny_config(tiny_checkpoints["llama"], augment={"enabled": False}))
    answer = rag.query(QUESTION, chunks=list(CHUNKS))
    rag.close()
    directory = rag.cache.store.disk.directory
    files = sorted(directory.glob(f"*{SUFFIX}"))
    assert files
    for path in files:
        path.write_bytes(path.read_bytes()[:100])
    fresh = AdaRAG(rag.config, loaded_engine=rag.engine)
    again = fresh.query(QUESTION, chunks=list(CHUNKS))
    assert "corrupted KV cache file" in caplog.text
    assert again.trace.steps[0].tiers == ("miss", "miss", "miss")
    assert again.text == answer.text
