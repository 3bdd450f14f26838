"""FusionRAG and Cache-Craft policies with the real SmolLM2-135M-Instruct on MuSiQue passages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adarag.config import AdaRagConfig
from adarag.engine.selection import num_to_recompute
from adarag.pipeline import AdaRAG
from adarag.policies import POLICIES
from adarag.schema import GenerationParams

pytestmark = pytest.mark.integration
DATA = Path(__file__).resolve().parents[1] / "data" / "musique_sample.jsonl"
PARAMS = GenerationParams(max_new_tokens=8)


@pytest.fixture(scope="module")
def record() -> dict:
    return json.loads(DATA.read_text().splitlines()[0])


def _rag(real_config: AdaRagConfig, name: str, tmp_path: Path) -> AdaRAG:
    overrides = POLICIES[name].overrides
    cache = {**overrides["cache"], "store": {"storage_dtype": "float32"}}
    return AdaRAG(
        real_config,
        home=tmp_path / name,
        cache=cache,
        augment=overrides["augment"],
        experimental=overrides.get("experimental", {}),
    )


def test_cachecraft_answers_a_repeated_prompt_exactly(real_config, record, tmp_path):
    rag = _rag(real_config, "cachecraft", tmp_path)
    passages = [p["text"] for p in record["passages"][:3]]
    first = rag.query(record["question"], chunks=passages, params=PARAMS)
    assert first.trace.steps[-1].tiers == ("miss", "miss", "miss")
    again = rag.query(record["question"], chunks=passages, params=PARAMS)
    assert again.trace.steps[-1].tiers == ("variant", "variant", "variant")
    assert again.trace.num_recomputed_tokens == len(rag.prompts.query_ids(record["question"]))
    assert again.text == first.text
    # reordered: each variant pays its CFO, a different share per chunk
    layout = rag.prompts.layout(record["question"], passages[::-1])
    output, hits, _ = rag.augmentation.fused_prefill(layout, PARAMS.max_new_tokens)
    ratios = [hit.recompute_ratio for hit in hits]
    assert all(0.0 < ratio < 1.0 for ratio in ratios[1:]) and len(set(ratios)) > 1
    assert output.num_recomputed_tokens < layout.num_tokens


def test_fusionrag_fuses_and_answers(real_config, record, tmp_path):
    rag = _rag(real_config, "fusionrag", tmp_path)
    passages = [p["text"] for p in record["passages"][:4]]
    assert rag.warm(passages) == len(passages)
    answer = rag.query(record["question"], chunks=passages[1:], params=PARAMS)
    # the first chunk's warm KV is the exact KV of a one-chunk prompt (a hard hit)
    assert answer.trace.steps[-1].tiers == ("hard", "fused", "fused")
    assert answer.text.strip()
    # 15% of the fused chunks' tokens (global budget) and the query were recomputed
    layout = rag.prompts.layout(record["question"], passages[1:])
    budget = sum(num_to_recompute(len(ids), 0.15) for ids in layout.chunk_ids[1:])
    assert answer.trace.num_recomputed_tokens == budget + len(layout.query_ids)
