"""The JSON nesting count of ``adarag serve``, against the depth of the parsed value."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adarag.serve.errors import APIError
from adarag.serve.limits import check_json_depth

tricky_text = st.text(alphabet='[]{}"\\ ab\n\u00e9', max_size=12)
values = st.recursive(
    st.none() | st.booleans() | st.integers() | tricky_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(tricky_text, inner, max_size=3),
    max_leaves=30,
)


def depth(value) -> int:
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    return 0


@settings(max_examples=150, deadline=None)
@given(values, st.booleans())
def test_the_count_is_the_parsed_depth_whatever_the_strings_hold(value, ascii_only):
    body = json.dumps(value, ensure_ascii=ascii_only).encode()
    true_depth = depth(value)
    check_json_depth(body, max(true_depth, 1))
    if true_depth > 1:
        with pytest.raises(APIError, match="max_json_depth") as refused:
            check_json_depth(body, true_depth - 1)
        assert refused.value.status == 400


def test_an_unterminated_string_is_scanned_in_linear_time():
    body = b'{"a": "' + b'\\"' * 2_000_000  # every quote escaped, no closing one
    check_json_depth(body, 4)
    check_json_depth(b"[" * 5 + b'"' + b"[" * 1_000_000, 5)  # brackets inside the string
