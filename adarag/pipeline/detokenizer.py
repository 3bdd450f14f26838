"""Incremental detokenization with stop strings, for streaming answers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class StreamingDetokenizer:
    """Turns generated token ids into text deltas, holding back text a stop string may start.

    Example:
        >>> stream = StreamingDetokenizer(tokenizer, stop=("Question:",))
        >>> delta = stream.push(token_id)  # "" while a stop string might be forming
    """

    def __init__(self, tokenizer: Any, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.token_ids: list[int] = []
        self.emitted = 0
        self.stopped = False

    @property
    def text(self) -> str:
        """Answer text so far, cut at the first stop string."""
        full = self.tokenizer.decode(self.token_ids, skip_special_tokens=True)
        cut = min((idx for s in self.stop if (idx := full.find(s)) >= 0), default=len(full))
        return full[:cut]

    def push(self, token_id: int) -> str:
        """Add a token; return the newly final text (may be empty)."""
        self.token_ids.append(token_id)
        full = self.tokenizer.decode(self.token_ids, skip_special_tokens=True)
        stop_at = min((idx for s in self.stop if (idx := full.find(s)) >= 0), default=None)
        if stop_at is not None:
            self.stopped = True
            return self._emit(full[:stop_at])
        if full.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next token
            return ""
        hold = max((_overlap(full, s) for s in self.stop), default=0)
        return self._emit(full[: len(full) - hold])

    def flush(self) -> str:
        """Text held back at the end of generation."""
        return self._emit(self.text)

    def _emit(self, final_text: str) -> str:
        delta = final_text[self.emitted :]
        self.emitted = max(self.emitted, len(final_text))
        return delta


def _overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``stop``."""
    for size in range(min(len(stop) - 1, len(text)), 0, -1):
        if text.endswith(stop[:size]):
            return size
    return 0
