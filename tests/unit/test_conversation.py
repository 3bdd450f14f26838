"""Which earlier turns a conversation carries, and how they enter the prompt."""

from __future__ import annotations

from adarag.conversation import Conversation
from adarag.pipeline.prompt import PromptBuilder
from tests.unit.engine.helpers import CHUNKS


def test_a_first_message_carries_nothing():
    assert Conversation().history() == []


def test_a_follow_up_carries_the_recent_grounded_turns_only():
    conversation = Conversation(max_turns=2)
    conversation.add_turn("Who was Lothair II's mother?", "Ermengarde of Tours")
    conversation.add_turn("What is the capital of Peru?", "I don't know.", grounded=False)
    conversation.add_turn("Where was Lothair II king?", "Lotharingia")
    conversation.add_turn("And his father?", "Lothair I")
    assert conversation.history() == [
        ("Where was Lothair II king?", "Lotharingia"),
        ("And his father?", "Lothair I"),
    ]
    assert Conversation(max_turns=0, turns=conversation.turns).history() == []


def test_earlier_turns_become_chat_turns_after_the_chunks(tiny_checkpoints):
    from transformers import AutoTokenizer

    from adarag.config import PromptConfig

    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoints["llama"])
    prompts = PromptBuilder(tokenizer, PromptConfig())
    plain = prompts.layout("when did she die?", CHUNKS)
    history = [("who was the queen?", "ermengarde"), ("where?", "tours")]
    turned = prompts.layout("when did she die?", CHUNKS, history)
    # the system prefix and the chunks are untouched: their KV is reused across turns
    assert turned.system_ids == plain.system_ids and turned.chunk_ids == plain.chunk_ids
    text = tokenizer.decode([t for ids in (*turned.history_ids, turned.query_ids) for t in ids])
    assert text.count("<|im_start|>assistant") == 3  # two answers, then the new answer's turn
    assert text.index("who was the queen?") < text.index("ermengarde") < text.index("where?")
    assert text.index("tours") < text.index("when did she die?")
    assert text.endswith(tokenizer.decode(plain.query_ids)[-len("<|im_start|>assistant\n") :])
    assert "Earlier" not in text


def test_each_earlier_turn_is_a_segment_with_the_same_ids_in_every_later_prompt(tiny_checkpoints):
    from transformers import AutoTokenizer

    from adarag.config import PromptConfig

    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoints["llama"])
    prompts = PromptBuilder(tokenizer, PromptConfig())
    turns = [("who was the queen?", "ermengarde"), ("where?", "tours")]
    second = prompts.layout("where?", CHUNKS, turns[:1])
    third = prompts.layout("when did she die?", CHUNKS, turns)
    assert len(second.history_ids) == 1 and len(third.history_ids) == 2
    assert third.history_ids[0] == second.history_ids[0]  # the same cache key in both prompts
    assert third.query_ids == prompts.layout("when did she die?", CHUNKS).query_ids
    assert "where?" in tokenizer.decode(third.history_ids[1])
    # the same text as the turns laid out in the query suffix
    joined = PromptBuilder(tokenizer, PromptConfig(enable_turn_reuse=False))
    whole = joined.layout("when did she die?", CHUNKS, turns)
    assert whole.history_ids == ()
    assert tokenizer.decode(third.token_ids) == tokenizer.decode(whole.token_ids)
