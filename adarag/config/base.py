"""What every configuration section shares: the frozen base model, its checks, the home."""

from __future__ import annotations

import os
import re
import stat
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, SecretStr, model_validator

DEFAULT_MODEL = "default"


def default_home() -> Path:
    """Return adarag's home directory: ``$ADARAG_HOME``, else ``$XDG_CACHE_HOME/adarag``."""
    explicit = os.environ.get("ADARAG_HOME")
    if explicit:
        return Path(explicit).expanduser()
    xdg_cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg_cache).expanduser() / "adarag"


SECRET_FIELDS = frozenset(
    {
        "remote_password",
        "signing_key",
        "vllm_handoff_key",
        "vllm_handoff_password",
        "vllm_server_api_key",
    }
)
"""Settings whose values never appear in a message or a log."""

MAX_CONFIG_FILE_BYTES = 1 << 20
"""A configuration file larger than this is refused (it is never a configuration)."""

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class _Frozen(BaseModel):
    # Inputs stay out of a ValidationError's text: a secret setting is never echoed (messages
    # built by AdaRagConfig.build show values, but not secrets).
    model_config = ConfigDict(
        frozen=True, extra="forbid", allow_inf_nan=False, hide_input_in_errors=True
    )

    @model_validator(mode="before")
    @classmethod
    def _check_raw_values(cls, data: Any) -> Any:
        """Refuse what lax validation would let through.

        That is ``true``/``false`` where anything but a switch is expected (a mistake, not 1 or
        0, nor the text "True"), and text with lone surrogates (not valid Unicode; each section
        checks its own fields).
        """
        if isinstance(data, dict):
            for name, value in data.items():
                field = cls.model_fields.get(name)
                if field is not None and isinstance(value, bool) and not _admits_bool(field):
                    raise ValueError(f"{name} must be {_kind(field)}, got {str(value).lower()}")
                if field is None or _is_section(field):
                    continue  # unknown keys are reported as such; sections check their own
                for text in _strings(value):
                    found = _LONE_SURROGATE.search(text)
                    if found is not None:
                        raise ValueError(
                            f"{name} holds a lone surrogate U+{ord(found.group()):04X}, which is "
                            "not valid Unicode; remove it"
                        )
        return data


def _strings(value: Any) -> list[str]:
    """The strings of a raw value: itself, or the keys and items of a dict or list (one level)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [item for pair in value.items() for item in pair if isinstance(item, str)]
    if isinstance(value, list | tuple):
        return [item for item in value if isinstance(item, str)]
    return []


def _is_section(field: Any) -> bool:
    annotation = field.annotation
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _admits_bool(field: Any) -> bool:
    annotation = field.annotation
    return annotation is bool or bool in typing.get_args(annotation)


def _kind(field: Any) -> str:
    """What a field holds, for a message: "a number", "text", "a path", "one of 'a', 'b'"..."""
    members = {field.annotation, *typing.get_args(field.annotation)}
    literals = [arg for member in members for arg in _literal_values(member)]
    if literals:
        return "one of " + ", ".join(repr(value) for value in literals)
    if typing.get_origin(field.annotation) in (tuple, list):
        return "a list"
    if members & {int, float}:
        return "a number"
    if Path in members:
        return "a path"
    if members & {str, SecretStr}:
        return "text"
    return "a value of its documented type"


def _literal_values(annotation: Any) -> tuple[Any, ...]:
    return typing.get_args(annotation) if typing.get_origin(annotation) is Literal else ()


def _check_path(value: Any, name: str) -> Any:
    """Refuse an empty path or one holding a NUL character (before it becomes a Path)."""
    if isinstance(value, str | Path) and (not str(value).strip() or "\x00" in str(value)):
        raise ValueError(f"{name} must be a directory path, got {str(value)!r}")
    return value


def _read_config_file(path: Path) -> str:
    """The text of a regular file of at most :data:`MAX_CONFIG_FILE_BYTES`, read without blocking.

    Raises:
        OSError: The file cannot be opened or read.
        ValueError: It is not a regular file (a FIFO or a device is never read) or is too large.
        UnicodeDecodeError: It is not UTF-8.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("it is not a regular file")
        data = handle.read(MAX_CONFIG_FILE_BYTES + 1)
    if len(data) > MAX_CONFIG_FILE_BYTES:
        raise ValueError(f"it is larger than {MAX_CONFIG_FILE_BYTES >> 20} MiB")
    return data.decode("utf-8")


def _deep_update(target: dict[str, Any], updates: dict[str, Any]) -> None:
    """Merge ``updates`` into ``target``: nested dicts (and models, dumped) key by key."""
    for key, value in updates.items():
        if isinstance(value, BaseModel):
            value = value.model_dump()
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _deep_update(target[key], value)
        else:
            target[key] = value
