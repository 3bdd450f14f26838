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
