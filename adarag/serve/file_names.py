"""The names documents sent over HTTP are kept and listed under."""

from __future__ import annotations

import unicodedata

from adarag.errors import InputError
from adarag.retrievers.file_types import is_hidden, is_supported, unsupported_type_message

MAX_NAME_BYTES = 255
NAME_PUNCTUATION = frozenset(" -_.,()[]+&@#'~!%=")
"""The characters a kept name may hold besides letters, combining marks and digits (of any
script): no markup (``<>"``), no bidirectional or other invisible formatting characters
(U+202E shows a name backwards), no separators but the plain space."""


def checked_name(filename: str) -> str:
    """A sent file's name as it is kept: its last path part, checked.

    Raises:
        InputError: It is empty, hidden, too long, holds control characters or a character
            outside letters, marks, digits and :data:`NAME_PUNCTUATION`, is not valid UTF-8,
            or is not of a type ingest reads.
    """
    name = filename.replace("\\", "/").rsplit("/", 1)[-1].strip()
    if not name or is_hidden(name) or any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise InputError(
            f"the file name {filename!r} is not usable; send a plain name such as 'manual.pdf'"
        )
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        raise InputError(f"the file name {filename!r} is not valid UTF-8; rename it") from None
    if size > MAX_NAME_BYTES:
        raise InputError(f"the file name is {size} bytes long; send one of at most 255")
    odd = next((c for c in name if not _is_name_character(c)), None)
    if odd is not None:
        raise InputError(
            f"the file name {name.encode('ascii', 'backslashreplace').decode()!r} holds "
            f"U+{ord(odd):04X} ({unicodedata.name(odd, 'unnamed')}); rename it using letters, "
            f"digits, spaces and {''.join(sorted(NAME_PUNCTUATION - {' '}))}"
        )
    if not is_supported(name):
        raise InputError(unsupported_type_message(name))
    return name


def _is_name_character(character: str) -> bool:
    return unicodedata.category(character)[0] in "LMN" or character in NAME_PUNCTUATION
