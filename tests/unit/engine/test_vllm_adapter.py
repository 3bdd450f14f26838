"""The vLLM model adapter, over stand-ins laid out like vLLM's modules (no vLLM needed)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from adarag.engine.batch import ForwardBatch, SegmentPlan
from adarag.engine.context_pass import query_over_contexts
from adarag.engine.model import DecoderModel
from adarag.engine.runner import Runner
from adarag.engine.vllm.adapter import SUPPORTED_ARCHITECTURES, VLLMDecoderAdapter, check_supported
from adarag.errors import ModelLoadError
from adarag.evaluation.reuse import independent_chunks
from tests.unit.engine.helpers import CHUNKS, QUESTION, layout_of, load_engine


class _Linear(nn.Module):
    """vLLM's linears return (output, output_bias)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.linear = linear

    def forward(self, x):
        return self.linear(x), None


class _LogitsProcessor(nn.Module):
    def forward(self, lm_head, hidden):
        return hidden @ lm_head.weight.T


def _vllm_like(model: DecoderModel, class_name: str) -> nn.Module:
    """Our model's own modules rearranged the way vLLM lays out a Llama-family model."""
    layers = nn.ModuleList()
    for source in model.layers:
        layer = nn.Module()
        layer.input_layernorm = source.input_layernorm
        layer.post_attention_layernorm = source.post_attention_layernorm
        layer.mlp = source.mlp
        layer.self_attn = nn.Module()
        layer.self_attn.qkv_proj = _Linear(source.self_attn.qkv_proj)
        layer.self_attn.o_proj = _Linear(source.self_attn.o_proj)
        layer.self_attn.q_norm = source.self_attn.q_norm
        layer.self_attn.k_norm = source.self_attn.k_norm
        layers.append(layer)
    wrapper = type(class_name, (nn.Module,), {})()
    wrapper.model = nn.Module()
    wrapper.model.embed_tokens = model.embed_tokens
    wrapper.model.layers = layers
    wrapper.model.norm = model.norm
    wrapper.lm_head = model.lm_head
    wrapper.logits_processor = _LogitsProcessor()
    return wrapper


@pytest.mark.parametrize(
    ("family", "class_name"), [("llama", "LlamaForCausalLM"), ("qwen3", "Qwen3ForCausalLM")]
)
def test_adapter_over_vllm_modules_prefills_like_our_model(
    family, class_name, tiny_checkpoints, tiny_config
):
    engine = load_engine(tiny_config(tiny_checkpoints[family]))
    adapter = VLLMDecoderAdapter(_vllm_like(engine.model, class_name), engine.spec)
    config = tiny_config(tiny_checkpoints[family])
    runner = Runner(adapter, config.engine, config.kernels)
    layout = layout_of(engine, QUESTION, CHUNKS)
    batch = ForwardBatch(
        torch.tensor(layout.token_ids), (SegmentPlan(0, layout.num_tokens),), extra_capacity=0
    )
    ours, theirs = engine.runner.prefill(batch), runner.prefill(batch)
    torch.testing.assert_close(theirs.logits, ours.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(theirs.kv.k, ours.kv.k, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(theirs.layer_hidden, ours.layer_hidden, atol=1e-5, rtol=1e-5)
    assert torch.equal(adapter.lm_head_weight, engine.model.lm_head_weight)
    assert torch.equal(adapter.final_norm_weight, engine.model.final_norm_weight)


def test_unknown_vllm_model_class_names_the_supported_ones():
    with pytest.raises(ModelLoadError) as err:
        check_supported("GPT2LMHeadModel", "gpt2")
    for family, classes in SUPPORTED_ARCHITECTURES.items():
        assert family in str(err.value)
        assert all(name in str(err.value) for name in classes)


def test_vllm_class_of_another_family_is_rejected():
    check_supported("LlamaForCausalLM", "mistral")
    with pytest.raises(ModelLoadError, match="Qwen2ForCausalLM for model family 'llama'"):
        check_supported("Qwen2ForCausalLM", "llama")


def test_the_gain_rules_pass_over_cached_contexts_runs_on_vllm_modules(
    tiny_checkpoints, tiny_config
):
    """``stop_rule="gain"`` on the vLLM backend: its runner drives vLLM's modules the same way."""
    config = tiny_config(tiny_checkpoints["llama"])
    engine = load_engine(config)
    adapter = VLLMDecoderAdapter(_vllm_like(engine.model, "LlamaForCausalLM"), engine.spec)
    runner = Runner(adapter, config.engine, config.kernels)
    layout = layout_of(engine, QUESTION, CHUNKS)
    system_kv, chunk_kvs = independent_chunks(engine, layout)
    contexts = [[system_kv], *([system_kv, kv] for kv in chunk_kvs)]
    ours = query_over_contexts(engine.runner, layout.query_ids, contexts)
    theirs = query_over_contexts(runner, layout.query_ids, contexts)
    torch.testing.assert_close(theirs.logits, ours.logits, atol=1e-5, rtol=1e-5)
