"""The root configuration: its sections, how it is built and loaded, and its error messages."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from adarag.config.augment import AugmentConfig
from adarag.config.base import (
    SECRET_FIELDS,
    _check_path,
    _deep_update,
    _Frozen,
    _read_config_file,
    default_home,
)
from adarag.config.cache import CacheConfig
from adarag.config.chat import ChatConfig
from adarag.config.engine import EngineConfig, KernelConfig
from adarag.config.experimental import ExperimentalConfig, move_to_experimental
from adarag.config.prompt import PromptConfig
from adarag.config.recompute import RecomputeConfig
from adarag.config.retrieval import RetrievalConfig
from adarag.config.serve import ServeConfig
from adarag.config.store import redact_url
from adarag.errors import ConfigError


class AdaRagConfig(_Frozen):
    """The root configuration."""

    home: Path = Field(
        default_factory=default_home,
        description="Model, KV cache and knowledge-base directory ($ADARAG_HOME).",
    )
    engine: EngineConfig = Field(default_factory=EngineConfig)
    kernels: KernelConfig = Field(default_factory=KernelConfig)
    prompt: PromptConfig = Field(default_factory=PromptConfig)
    cache: CacheConfig = Field(default_factory=CacheConfig)
    augment: AugmentConfig = Field(default_factory=AugmentConfig)
    retrieval: RetrievalConfig = Field(default_factory=RetrievalConfig)
    serve: ServeConfig = Field(default_factory=ServeConfig)
    chat: ChatConfig = Field(default_factory=ChatConfig)
    experimental: ExperimentalConfig = Field(
        default_factory=ExperimentalConfig,
        description="Research levers from the literature, off or fixed by default.",
    )

    @property
    def selection(self) -> RecomputeConfig:
        """The selection a request carries: ``cache.recompute`` and ``experimental.recompute``."""
        return RecomputeConfig.of(self.cache.recompute, self.experimental.recompute)

    @model_validator(mode="before")
    @classmethod
    def _move_old_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = copy.deepcopy(data)
            move_to_experimental(data)
        return data

    @field_validator("home", mode="before")
    @classmethod
    def _check_home(cls, value: Any) -> Any:
        return _check_path(value, "home")

    @classmethod
    def build(cls, base: AdaRagConfig | None = None, **overrides: Any) -> AdaRagConfig:
        """Return ``base`` (or defaults) with nested overrides applied and validated.

        Args:
            base: Starting configuration; defaults when None.
            **overrides: Section names mapped to dicts, e.g. ``cache={"soft": {"recompute_ratio":
                0.05}}``, or top-level fields. Unknown keys are errors.

        Raises:
            ConfigError: An override names no field or has an invalid value.
        """
        data = base.model_dump() if base is not None else {}
        _deep_update(data, overrides)
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            raise ConfigError(
                f"invalid adarag configuration: {_describe(err)}; fix the value in the "
                "configuration file or the override"
            ) from err
        except RecursionError:
            raise ConfigError(
                "invalid adarag configuration: a value nests too deeply; fix the configuration"
            ) from None

    @classmethod
    def from_file(cls, path: str | Path) -> AdaRagConfig:
        """Load a configuration from a JSON file.

        Raises:
            ConfigError: The file is missing, not JSON, or not a valid configuration.
        """
        file_path = Path(path)
        try:
            text = _read_config_file(file_path)
            data = json.loads(text)
        except RecursionError:
            raise ConfigError(
                f"cannot read configuration file {file_path}: its JSON nests too deeply; write "
                "a JSON object of AdaRagConfig fields"
            ) from None
        except json.JSONDecodeError as err:
            raise ConfigError(
                f"cannot read configuration file {file_path}: invalid JSON ({err.msg} at line "
                f"{err.lineno}, column {err.colno}); write a JSON object of AdaRagConfig fields"
            ) from err
        except UnicodeDecodeError as err:
            raise ConfigError(
                f"cannot read configuration file {file_path}: it is not UTF-8 text (bad byte at "
                f"offset {err.start}); write a JSON object of AdaRagConfig fields"
            ) from err
        except (OSError, ValueError) as err:
            reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
            raise ConfigError(
                f"cannot read configuration file {file_path}: {reason}; pass a JSON file of "
                "AdaRagConfig fields"
            ) from err
        if not isinstance(data, dict):
            raise ConfigError(
                f"configuration file {file_path} holds a JSON {type(data).__name__}, not an "
                'object; write a JSON object of AdaRagConfig fields, e.g. {"retrieval": '
                '{"top_k": 4}}'
            )
        return cls.build(**data)


def _describe(err: ValidationError) -> str:
    """A pydantic validation error on one line: ``where: what (got value)`` per problem.

    The members of a union that all rejected one value make one problem, their reasons joined.
    """
    problems: dict[tuple[Any, ...], tuple[list[str], Any, str]] = {}
    for error in err.errors():
        loc = tuple(error["loc"])
        if loc and isinstance(loc[-1], str) and _is_union_member(loc[-1]):
            loc = loc[:-1]
        value = error.get("input")
        message = str(error["msg"]).removeprefix("Value error, ").replace("\n", " ")
        if len(message) > MAX_MESSAGE_CHARS:  # a validator's message can quote a huge value
            message = message[: MAX_MESSAGE_CHARS - 3] + "..."
        if error["type"] == "extra_forbidden":
            known = _known_fields(loc[:-1])
            message = "unknown setting (check its spelling" + (
                f"; known here: {', '.join(known)})" if known else ")"
            )
        messages, _, kind = problems.setdefault(loc, ([], value, error["type"]))
        if message not in messages:
            messages.append(message)
    parts: list[str] = []
    for loc, (messages, value, kind) in problems.items():
        where = ".".join(str(part) for part in loc) or "configuration"
        text = f"{where}: {', or '.join(messages)}"
        if kind not in ("value_error", "assertion_error", "extra_forbidden") and not isinstance(
            value, dict | list
        ):
            shown = _shown_value(loc, value)
            text += f" (got {shown[:60] + '...' if len(shown) > 60 else shown})"
        parts.append(text)
    if len(parts) > 3:
        parts = [*parts[:3], f"and {len(parts) - 3} more"]
    return "; ".join(parts)


MAX_MESSAGE_CHARS = 200
"""A setting's error message is cut to this length (the value it quotes may be megabytes)."""


def _shown_value(loc: tuple[Any, ...], value: Any) -> str:
    """``value`` for an error message: a secret is never shown, a URL without its password."""
    field = next((part for part in reversed(loc) if isinstance(part, str)), "")
    if field in SECRET_FIELDS:
        return "*** (a secret, not shown)"
    if field == "remote_url" and isinstance(value, str):
        return repr(redact_url(value))
    return repr(value)


def _is_union_member(part: str) -> bool:
    """Whether a pydantic error location part names a union member (``str``, ``int``, ...)."""
    return part in ("str", "int", "float", "bool", "none") or "[" in part


def _known_fields(loc: tuple[Any, ...]) -> list[str]:
    """The field names of the config section at ``loc`` (empty when it is not a section)."""
    model: Any = AdaRagConfig
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        annotation = field.annotation if field is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return sorted(model.model_fields)
