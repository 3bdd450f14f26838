"""A conversation condensed into a retrieval query and a question."""

from __future__ import annotations

from adarag.conversation import Conversation


def test_first_message_is_used_as_it_is():
    conversation = Conversation()
    assert conversation.retrieval_query("Who was Lothair II?") == "Who was Lothair II?"
    assert conversation.question("Who was Lothair II?") == "Who was Lothair II?"


def test_follow_up_carries_the_recent_turns_only():
    conversation = Conversation(max_turns=1)
    conversation.add_turn("Who was Lothair II's mother?", "Ermengarde of Tours")
    conversation.add_turn("Where was Lothair II king?", "Lotharingia")
    query = conversation.retrieval_query("When did she die?")
    assert query == "Where was Lothair II king?\nWhen did she die?"
    question = conversation.question("When did she die?")
    assert "Lotharingia" in question and "Ermengarde" not in question
    assert question.endswith("When did she die?")
