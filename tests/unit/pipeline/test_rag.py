"""AdaRAG with a tiny engine: augmentation steps, traces, streaming, bad input."""

from __future__ import annotations

import asyncio

import pytest
import torch

from adarag import AdaRAG, Chunk, MemoryRetriever
from adarag.config import AdaRagConfig
from adarag.engine.prefill_request import PrefillRequest
from adarag.errors import ConfigError, InputError
from adarag.pipeline.answer_stream import NO_CONTEXT_ANSWER
from adarag.profiles import generic_profile
from adarag.profiles.model_profile import AgreementCalibration, Calibration
from adarag.schema import GenerationParams
from tests.unit.engine.helpers import CHUNKS, QUESTION

PARAMS = GenerationParams(max_new_tokens=4)


@pytest.fixture()
def make_rag(tiny_checkpoints, tiny_config):
    def make(**overrides):
        return AdaRAG(
            tiny_config(tiny_checkpoints["llama"], **overrides),
            retriever=MemoryRetriever([Chunk(text) for text in CHUNKS]),
        )

    return make


def test_each_step_reuses_the_previous_steps_chunks_from_the_hard_tier(make_rag):
    rag = make_rag(augment={"stop_rule": "confidence", "threshold": 1.0})  # every chunk is added
    answer = rag.query(QUESTION, chunks=list(CHUNKS), params=PARAMS)
    layout = rag.prompts.layout(QUESTION, CHUNKS)
    steps = answer.trace.steps
    assert [s.num_chunks for s in steps] == [1, 2, 3]
    assert answer.trace.stop_reason == "exhausted"
    for idx, step in enumerate(steps):
        assert step.tiers[:idx] == ("hard",) * idx
        assert step.tiers[idx] == "miss"
        # only the new chunk and the query suffix are computed
        expected = len(layout.chunk_ids[idx]) + len(layout.query_ids)
        assert step.num_recomputed_tokens == expected
        assert step.num_processed_tokens == expected


def test_a_confident_first_step_stops_with_one_chunk(make_rag):
    rag = make_rag(augment={"stop_rule": "confidence", "threshold": 0.0})
    answer = rag.query(QUESTION, chunks=list(CHUNKS), params=PARAMS)
    assert answer.trace.stop_reason == "confident"
    assert len(answer.trace.steps) == 1
    assert answer.chunks == (Chunk(CHUNKS[0]),)


def test_the_trace_is_complete(make_rag):
    answer = make_rag(augment={"threshold": 1.0}).query(QUESTION, params=PARAMS)
    trace = answer.trace
    assert trace.ttft_s > 0 and trace.retrieval_s > 0
    assert trace.num_prompt_tokens > 0
    for step in trace.steps:
        assert 0.0 <= step.confidence <= 1.0
        assert 0.0 <= step.kl_score <= 1.0 and 0.0 <= step.entropy_score <= 1.0
        assert step.prefill_s > 0 and step.confidence_s > 0
        assert len(step.tiers) == step.num_chunks
    assert answer.num_completion_tokens > 0
    assert (
        answer.num_cached_tokens == trace.num_prompt_tokens - trace.steps[-1].num_recomputed_tokens
    )


def test_static_mode_is_one_step_over_all_chunks(make_rag):
    answer = make_rag(augment={"enabled": False}).query(QUESTION, params=PARAMS)
    assert answer.trace.stop_reason == "static"
    assert [s.num_chunks for s in answer.trace.steps] == [3]
    assert answer.trace.steps[0].confidence is not None


def test_stream_yields_deltas_and_knows_its_chunks_first(make_rag):
    stream = make_rag().stream(QUESTION, params=GenerationParams(max_new_tokens=6))
    assert stream.chunks and stream.trace.steps
    deltas = list(stream)
    assert "".join(deltas) == stream.text
    assert stream.answer().text == stream.text.strip()


def test_concurrent_async_queries_both_complete(make_rag):
    rag = make_rag()

    async def both():
        return await asyncio.gather(
            rag.aquery(QUESTION, params=PARAMS), rag.aquery("where is berlin?", params=PARAMS)
        )

    first, second = asyncio.run(both())
    assert first.trace.steps and second.trace.steps


def test_no_retrievable_context_gives_a_clear_answer(make_rag):
    answer = make_rag().query("zzz qqq", params=PARAMS)
    assert answer.text == NO_CONTEXT_ANSWER
    assert answer.trace.stop_reason == "no_context" and answer.chunks == ()


def test_bad_requests_are_rejected(make_rag):
    rag = make_rag()
    with pytest.raises(InputError, match="top_k must be at least 1"):
        rag.query(QUESTION, top_k=0)
    with pytest.raises(InputError, match="question is empty"):
        rag.query("  ")


def test_more_lens_layers_than_the_model_has_is_rejected(make_rag):
    rag = make_rag(experimental={"augment": {"num_lens_layers": 5}})
    with pytest.raises(ConfigError, match="num_lens_layers is 5 but the model has only 2 layers"):
        rag.query(QUESTION, params=PARAMS)


@pytest.mark.parametrize("field", ["threshold", "kl_weight"])
def test_threshold_and_weight_outside_unit_interval_are_config_errors(field):
    with pytest.raises(ConfigError, match=field):
        AdaRagConfig.build(augment={field: 1.5})


def test_the_agreement_rule_without_a_calibration_answers_from_static_top_k_without_warning(
    make_rag, caplog
):
    """The packaged models' default: logged once at info level, never a warning on stderr."""
    rag = make_rag(augment={"stop_rule": "agreement"})
    with caplog.at_level("DEBUG", logger="adarag"):
        answer = rag.query(QUESTION, chunks=list(CHUNKS), params=PARAMS)
        rag.query(QUESTION, chunks=list(CHUNKS), params=PARAMS)
    fallback = [r for r in caplog.records if "no calibrated threshold" in r.getMessage()]
    assert [r.levelname for r in fallback] == ["INFO"]  # once, and never on stderr by default
    assert answer.trace.stop_reason == "static"
    assert [s.num_chunks for s in answer.trace.steps] == [3]


def _write_agreement_profile(rag: AdaRAG, threshold: float, probability: float = 1.0) -> None:
    """A profile whose agreement model says ``probability`` everywhere, where `calibrate` writes."""
    agreement = AgreementCalibration(
        "confidence", (0.0, 1.0), (probability, probability), threshold, 0.05, 2
    )
    profile = generic_profile(
        rag.engine.checkpoint.name, rag.engine.fingerprint, rag.engine.spec.num_layers
    ).with_calibration(Calibration(agreement=agreement))
    directory = rag.config.home / "profiles"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{rag.engine.fingerprint}.json").write_text(profile.to_json())


def test_the_agreement_rule_stops_at_the_first_stable_answer_past_the_floor(make_rag):
    rag = make_rag(
        augment={"stop_rule": "agreement"}, experimental={"augment": {"stability_tokens": 2}}
    )
    _write_agreement_profile(rag, threshold=0.5)
    answer = rag.query(QUESTION, chunks=list(CHUNKS), params=PARAMS)
    steps = answer.trace.steps
    assert steps[0].is_stable is None and steps[0].answer_prefix is not None
    assert all(s.probability == 1.0 and s.margin is not None for s in steps)
    for before, step in zip(steps, steps[1:], strict=False):
        assert step.is_stable == (step.answer_prefix == before.answer_prefix)
    stable_at = [s.num_chunks for s in steps[1:] if s.is_stable]
    if stable_at:
        assert answer.trace.stop_reason == "confident" and len(steps) == stable_at[0]
    else:
        assert answer.trace.stop_reason == "exhausted" and len(steps) == 3


def test_a_calibration_that_saves_too_few_tokens_says_so_once_and_answers_static(make_rag, caplog):
    rag = make_rag(augment={"stop_rule": "agreement"})
    agreement = AgreementCalibration("confidence", (0.0,), (1.0,), None, 0.05, 2, 0.0, 0.93)
    profile = generic_profile(
        rag.engine.checkpoint.name, rag.engine.fingerprint, rag.engine.spec.num_layers
    ).with_calibration(Calibration(agreement=agreement))
    (rag.config.home / "profiles").mkdir(parents=True, exist_ok=True)
    (rag.config.home / "profiles" / f"{rag.engine.fingerprint}.json").write_text(profile.to_json())
    with caplog.at_level("INFO", logger="adarag"):
        answers = [rag.query(QUESTION, chunks=list(CHUNKS), params=PARAMS) for _ in range(2)]
    assert caplog.text.count("93% of the static top-k's prefill time") == 1
    assert all(a.trace.stop_reason == "static" for a in answers)


def test_the_agreement_rule_decodes_no_answer_tokens_at_unconfident_steps(make_rag):
    rag = make_rag(augment={"stop_rule": "agreement"})
    _write_agreement_profile(rag, threshold=0.5, probability=0.2)
    answer = rag.query(QUESTION, chunks=list(CHUNKS), params=PARAMS)
    assert answer.trace.stop_reason == "exhausted" and len(answer.trace.steps) == 3
    assert all(s.answer_prefix is None and s.probability == 0.2 for s in answer.trace.steps)


def test_the_agreement_rule_keeps_its_floor(make_rag):
    rag = make_rag(augment={"stop_rule": "agreement"}, experimental={"augment": {"min_chunks": 3}})
    _write_agreement_profile(rag, threshold=0.5)
    answer = rag.query(QUESTION, chunks=list(CHUNKS), params=PARAMS)
    assert len(answer.trace.steps) == 3  # even when the answers repeat earlier


def test_a_retrieval_score_gap_caps_the_augmentation_depth(make_rag):
    rag = make_rag(
        augment={"stop_rule": "confidence", "threshold": 1.0},
        experimental={"augment": {"score_gap": 0.2}},
    )
    chunks = [
        Chunk(text, score=score) for text, score in zip(CHUNKS, (0.9, 0.85, 0.3), strict=True)
    ]
    answer = rag.query(QUESTION, chunks=chunks, params=PARAMS)
    assert [s.num_chunks for s in answer.trace.steps] == [1, 2]
    assert answer.trace.stop_reason == "exhausted"
    assert answer.chunks == tuple(chunks[:2])


def test_chunks_that_do_not_fit_the_context_are_left_out_lowest_ranked_first(make_rag, caplog):
    rag = make_rag()
    long = "the quick brown fox jumps " * 50
    chunks = [CHUNKS[0], long + "one", long + "two", long + "three"]
    with caplog.at_level("WARNING"):
        answer = rag.query(QUESTION, chunks=chunks, params=PARAMS)
    trace = answer.trace
    assert trace.num_dropped_chunks > 0 and "retrieved chunks (lowest-ranked first)" in caplog.text
    kept = len(chunks) - trace.num_dropped_chunks
    assert [c.text for c in answer.chunks] == chunks[:kept]
    assert trace.num_prompt_tokens + PARAMS.max_new_tokens <= rag.engine.max_context_tokens
    with_one_more = rag.prompts.layout(QUESTION, chunks[: kept + 1])
    assert with_one_more.num_tokens + PARAMS.max_new_tokens > rag.engine.max_context_tokens


def test_a_question_that_alone_exceeds_the_context_is_a_clear_error(make_rag):
    rag = make_rag()
    with pytest.raises(InputError, match="the question alone"):
        rag.query("why " * 600, chunks=list(CHUNKS), params=PARAMS)


@pytest.mark.parametrize("question", [None, 5, b"bytes", "lone \ud800 surrogate"])
def test_a_question_that_is_not_valid_text_is_a_clear_error(make_rag, question):
    rag = make_rag()
    for call in (rag.query, rag.retrieve):
        with pytest.raises(InputError, match="the question"):
            call(question)


def _each_step(rag):
    return list(rag.augmentation.prefill_steps(rag.layout(QUESTION, CHUNKS, PARAMS), 4))


@pytest.mark.parametrize("storage_dtype", ["float32", "float16"])
def test_steps_prefill_into_the_previous_steps_cache_and_compute_the_same(make_rag, storage_dtype):
    store = {"storage_dtype": storage_dtype, "admission": "always", "disk_capacity_bytes": 0}
    resident = _each_step(make_rag(cache={"store": store}))
    fresh = _each_step(
        make_rag(cache={"store": store}, experimental={"augment": {"reuse_step_kv": False}})
    )
    assert all(step.output.kv is resident[0].output.kv for step in resident)
    assert len({id(step.output.kv) for step in fresh}) == len(fresh)
    for kept, new in zip(resident, fresh, strict=True):
        assert kept.result.num_processed_tokens == new.result.num_processed_tokens
        if storage_dtype == "float32":  # the hard tier holds the very rows left in place
            assert torch.equal(kept.output.logits, new.output.logits)
        else:  # in place, the rows keep the precision the store would have rounded away
            assert torch.allclose(kept.output.logits, new.output.logits, atol=5e-2)
    rows = resident[-1].layout.num_tokens
    same = torch.equal(resident[-1].output.kv.k[:, :rows], fresh[-1].output.kv.k[:, :rows])
    assert same == (storage_dtype == "float32")


def test_a_step_whose_prefix_differs_gets_a_cache_of_its_own(make_rag):
    rag = make_rag(cache={"store": {"storage_dtype": "float32", "disk_capacity_bytes": 0}})
    augmented = rag.augmentation
    # the first step of the whole prompt: its cache has room for all of it
    first = next(augmented.prefill_steps(rag.layout(QUESTION, CHUNKS, PARAMS), 4))
    other = rag.layout(QUESTION, [CHUNKS[2], CHUNKS[1]], PARAMS)
    second, _, _ = augmented.fused_prefill(other, 4, first)
    assert second.kv is first.output.kv  # room enough; only the system prefix is kept
    full = rag.engine.prefill(PrefillRequest(other, max_new_tokens=4))
    assert torch.allclose(second.logits, full.logits, atol=1e-4)


class _StopAtOnce:
    """A stop rule's module: decode from the first step."""

    def wants_answer_prefix(self, step):
        return False

    def decide(self, step, max_steps):
        return "confident"


def test_a_new_stop_rule_is_one_module_and_one_registry_line(make_rag, monkeypatch):
    from types import MappingProxyType

    from adarag.augment import stop_rules

    # the one line in STOP_RULES (and the name in augment.stop_rule's Literal)
    rules = {**stop_rules.STOP_RULES, "at_once": lambda min_chunks, fitted: _StopAtOnce()}
    monkeypatch.setattr(stop_rules, "STOP_RULES", MappingProxyType(rules))
    base = make_rag(augment={"enabled": True}).config
    augment = base.augment.model_copy(update={"stop_rule": "at_once"})
    rag = AdaRAG(base.model_copy(update={"augment": augment}))
    answer = rag.query(QUESTION, chunks=CHUNKS, params=PARAMS)
    assert answer.trace.stop_reason == "confident"
    assert answer.trace.num_chunks_used == 1 < len(CHUNKS)
    # without the line the name is unknown
    monkeypatch.undo()
    with pytest.raises(KeyError):
        AdaRAG(base.model_copy(update={"augment": augment})).query(QUESTION, chunks=CHUNKS)


def test_engine_overrides_its_config_section_and_a_loaded_engine_is_shared(
    tiny_checkpoints, tiny_config
):
    rag = AdaRAG(tiny_config(tiny_checkpoints["llama"]), engine={"batch_decode": True})
    assert rag.config.engine.batch_decode
    shared = AdaRAG(rag.config, loaded_engine=rag.engine)
    assert shared.engine is rag.engine
    assert AdaRAG(rag.config).engine is not rag.engine


def test_a_misspelt_answering_option_is_an_error_not_ignored(make_rag):
    rag = make_rag()
    with pytest.raises(TypeError, match="'topk'"):
        rag.query(QUESTION, chunks=list(CHUNKS), topk=2)
    with pytest.raises(TypeError, match="'chunk'"):
        asyncio.run(rag.aquery(QUESTION, chunk=list(CHUNKS)))
