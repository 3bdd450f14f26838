"""Reading source files and cutting documents into token windows."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adarag.errors import InputError
from adarag.retrievers.chunking import expand_paths, read_source_file, split_by_tokens


def _word_spans(text):
    return [match.span() for match in re.finditer(r"\S+", text)]


def test_windows_have_the_size_and_overlap_asked_for():
    text = " ".join(f"w{i}" for i in range(25))
    chunks = split_by_tokens(text, _word_spans, chunk_tokens=10, overlap_tokens=3)
    words = [chunk.split() for chunk in chunks]
    assert all(len(w) <= 10 for w in words)
    assert words[0][-3:] == words[1][:3]
    assert words[-1][-1] == "w24"
    covered = {word for w in words for word in w}
    assert covered == set(text.split())


def test_short_text_is_one_chunk_and_empty_text_none():
    assert split_by_tokens("just a few words", _word_spans, 10, 2) == ["just a few words"]
    assert split_by_tokens("   ", _word_spans, 10, 2) == []


def test_window_ends_exactly_at_the_text_end():
    text = " ".join(f"w{i}" for i in range(10))
    chunks = split_by_tokens(text, _word_spans, chunk_tokens=10, overlap_tokens=2)
    assert chunks == [text]


def _subword_spans(text):
    """Tokens of at most 3 characters, as subword tokenizers cut long words."""
    spans = []
    for match in re.finditer(r"\S+", text):
        start, end = match.span()
        spans += [(idx, min(idx + 3, end)) for idx in range(start, end, 3)]
    return spans


@settings(max_examples=200, deadline=None)
@given(
    words=st.lists(st.text("abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=12), min_size=1),
    chunk_tokens=st.integers(2, 12),
    overlap=st.integers(0, 11),
)
def test_windows_are_cut_between_words_and_cover_every_word(words, chunk_tokens, overlap):
    overlap = min(overlap, chunk_tokens - 1)
    text = " ".join(words)
    chunks = split_by_tokens(text, _subword_spans, chunk_tokens, overlap)
    longest = max(-(-len(word) // 3) for word in words)  # tokens of the longest word
    for chunk in chunks:
        run = chunk.split()
        whole_words = any(words[i : i + len(run)] == run for i in range(len(words)))
        # cut inside a word only when that word alone is longer than the budget
        assert whole_words or longest > chunk_tokens
        assert len(_subword_spans(chunk)) <= chunk_tokens
    if longest <= chunk_tokens:
        assert {w for chunk in chunks for w in chunk.split()} == set(words)
    assert chunks[-1].endswith(words[-1][-1])


def test_a_name_is_never_split_across_windows():
    text = "The founder is Marta Kowalski and she lived in Lyon"
    chunks = split_by_tokens(text, _subword_spans, chunk_tokens=9, overlap_tokens=2)
    assert all("Marta" in chunk for chunk in chunks if "Kow" in chunk)
    assert all(chunk.split()[-1] in text.split() for chunk in chunks)


def test_jsonl_passages_and_qa_records_become_documents(tmp_path):
    path = tmp_path / "passages.jsonl"
    lines = [
        {"id": "p1", "title": "Paris", "text": "Paris is in France."},
        {"question": "q", "passages": [{"title": "Rome", "text": "Rome is in Italy."}]},
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    source = read_source_file(path)
    assert [(d.key, d.title) for d in source.documents] == [("p1", "Paris"), ("2#0", "Rome")]
    assert len(source.sha256) == 64


def test_bad_jsonl_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "ok"}\n{"title": "no text"}\n')
    with pytest.raises(InputError, match=r"bad.jsonl:2"):
        read_source_file(path)


def test_missing_path_and_binary_file_are_refused(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        expand_paths([tmp_path / "nope.md"])
    binary = tmp_path / "blob.txt"
    binary.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(InputError, match="not UTF-8"):
        read_source_file(binary)


def test_directories_expand_to_their_text_files(tmp_path):
    (tmp_path / "a.md").write_text("alpha")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("beta")
    (tmp_path / "image.png").write_bytes(b"\x89PNG")
    assert [p.name for p in expand_paths([tmp_path])] == ["a.md", "b.txt"]
