"""Prompt assembly from token segments."""

from __future__ import annotations

import pytest

from adarag.config import PromptConfig
from adarag.pipeline.prompt import PromptBuilder
from tests.tiny_models import build_tiny_tokenizer


def _builder() -> PromptBuilder:
    return PromptBuilder(build_tiny_tokenizer(), PromptConfig())


def test_chunk_ids_do_not_depend_on_neighbours():
    builder = _builder()
    shared = "berlin is the capital of germany"
    first = builder.layout("q?", ["paris is in france", shared, "the fox"])
    second = builder.layout("another question?", ["the lazy dog", shared])
    assert first.chunk_ids[1] == second.chunk_ids[1] == builder.chunk_ids(shared)
    assert first.system_ids == second.system_ids


def test_layout_renders_the_chat_template_around_the_chunks():
    builder = _builder()
    layout = builder.layout("what is it?", ["alpha text", "beta text"])
    text = builder.tokenizer.decode(layout.token_ids)
    assert text.startswith("<|im_start|>system\n")
    assert "Passages:\nalpha text\n\nbeta text\n\nQuestion: what is it?<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert layout.cu_segments == [0, *_cumulative(layout)]


def test_with_chunks_keeps_a_prefix_of_the_chunks():
    layout = _builder().layout("q?", ["a", "b", "c"])
    two = layout.with_chunks(2)
    assert two.chunk_ids == layout.chunk_ids[:2]
    assert two.query_ids == layout.query_ids


@pytest.mark.parametrize("history", [(), (("who is she?", "a poet."), ("born where?", "Lyon."))])
def test_messages_render_to_the_text_the_layout_encodes(history):
    # the messages a tracer is shown are the prompt the model computes, turn for turn
    builder = _builder()
    chunks = ["alpha text", "beta text"]
    layout = builder.layout("what is it?", chunks, history)
    messages = builder.messages("what is it?", chunks, history)
    assert [m["role"] for m in messages] == [
        "system",
        *["user", "assistant"] * len(history),
        "user",
    ]
    rendered = builder.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    assert builder.tokenizer.decode(layout.token_ids) == rendered


def _cumulative(layout):
    total, offsets = 0, []
    for segment in layout.segments:
        total += len(segment)
        offsets.append(total)
    return offsets


# SmolLM2's template: a list without a system message gets a default one
DEFAULT_SYSTEM_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant named Tiny<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _templated_builder(template: str) -> PromptBuilder:
    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = template
    return PromptBuilder(tokenizer, PromptConfig())


def test_messages_as_given_leave_out_the_templates_default_system_prompt():
    builder = _templated_builder(DEFAULT_SYSTEM_TEMPLATE)
    system = {"role": "system", "content": "be brief"}
    user = {"role": "user", "content": "the capital of france?"}
    prompted = builder.chat_ids([user])
    given = builder.chat_ids([user], add_default_system=False)
    assert builder.tokenizer.decode(prompted).count("named Tiny") == 1
    assert "named Tiny" not in builder.tokenizer.decode(given) and len(given) < len(prompted)
    assert (
        builder.chat_ids([user], add_default_system=False)
        == builder.chat_ids([system, user])[-len(given) :]
    )
    with_system = builder.chat_ids([system, user], add_default_system=False)
    assert with_system == builder.chat_ids([system, user])  # a system message given: no change


def test_a_template_without_a_default_system_prompt_counts_the_same_either_way():
    builder = _templated_builder(build_tiny_tokenizer().chat_template)
    user = [{"role": "user", "content": "the capital of france?"}]
    assert builder.chat_ids(user, add_default_system=False) == builder.chat_ids(user)
