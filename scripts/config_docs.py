"""Write docs/config.md, the configuration reference, from ``adarag.config``'s field descriptions.

Every setting of :class:`adarag.config.AdaRagConfig` is listed under its section (its dotted
path, as a ``--config`` JSON file or ``AdaRagConfig.build`` spells it) with its type, default and
description. ``tests/unit/test_config_docs.py`` fails when the committed file differs from what
this script writes.

Usage: ``python scripts/config_docs.py`` (from the repository root).
"""

from __future__ import annotations

import enum
import sys
import types
import typing
from pathlib import Path
from typing import Any

import annotated_types
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from adarag.config import AdaRagConfig

OUTPUT = Path(__file__).resolve().parents[1] / "docs" / "config.md"

HEADER = """\
# Configuration reference

Every setting of `AdaRagConfig`, by section. A `--config FILE` (JSON) or
`AdaRagConfig.build(section={...})` sets them by these names, e.g.
`{"cache": {"recompute": {"selection_policy": "kv_deviation"}}}`; unknown keys are refused.
The configuration is frozen: `AdaRAG.with_config(...)` gives a pipeline with other settings over
the same loaded model.

The user's settings come first; the last section, `experimental`, holds the research levers of
the related systems the framework hosts (off or fixed by default; the policies and benchmarks set
them). A setting that moved there from another section still loads, with a warning that names
its new key.

This file is generated from the field descriptions in `adarag/config/` by
`python scripts/config_docs.py`; edit the descriptions there, not this file.
"""

_BOUNDS = (
    (annotated_types.Ge, ">=", "ge"),
    (annotated_types.Gt, ">", "gt"),
    (annotated_types.Le, "<=", "le"),
    (annotated_types.Lt, "<", "lt"),
)


def _type_name(annotation: Any) -> str:
    """A short, stable spelling of a field's type."""
    if annotation is type(None):
        return "null"
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(repr(arg) for arg in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(arg) for arg in args)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(_type_name(arg) for arg in args)}]"
    if annotation is SecretStr:
        return "secret"
    if isinstance(annotation, type) and issubclass(annotation, Path):
        return "path"
    return getattr(annotation, "__name__", str(annotation))


def _bounds(field: FieldInfo) -> str:
    """The numeric bounds of a field, e.g. ``>= 0, <= 1``."""
    found = []
    for kind, symbol, attribute in _BOUNDS:
        for item in field.metadata:
            if isinstance(item, kind):
                found.append(f"{symbol} {getattr(item, attribute)}")
    return ", ".join(found)


def _value(value: Any) -> str:
    """A default as JSON-like text."""
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | Path):
        return repr(str(value))
    if isinstance(value, tuple):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    return repr(value)


def _default(field: FieldInfo, section_default: BaseModel, name: str) -> str:
    """The default of a leaf setting, as its section's default instance holds it."""
    if field.default_factory is not None:
        doc = getattr(field.default_factory, "__doc__", None)
        if getattr(field.default_factory, "__name__", "") != "<lambda>" and doc:
            first = doc.strip().splitlines()[0].removeprefix("Return ").rstrip(".")
            return "computed: " + first.replace("``", "")
        return "computed at start (see description)"
    if field.default is PydanticUndefined:
        return "required"
    return _value(getattr(section_default, name))


def _is_section(field: FieldInfo) -> bool:
    annotation = field.annotation
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _cell(text: str) -> str:
    """Text fit for one markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def _code(text: str) -> str:
    """Text as an inline code span, fit for a table cell."""
    return "`" + text.replace("|", "\\|") + "`" if text else ""


def _section_default(model: type[BaseModel], field: FieldInfo | None) -> BaseModel:
    """The default instance of a section (the parent's factory may override the class defaults)."""
    if field is not None and field.default_factory is not None:
        made = field.default_factory()  # type: ignore[call-arg]
        assert isinstance(made, model)
        return made
    return model()


def _sections(
    model: type[BaseModel], path: str, field: FieldInfo | None
) -> list[tuple[str, type[BaseModel], BaseModel]]:
    """``(dotted path, model, default instance)`` of a section and of its sub-sections, in order."""
    found = [(path, model, _section_default(model, field))]
    for name, child in model.model_fields.items():
        if _is_section(child):
            assert isinstance(child.annotation, type)
            found += _sections(child.annotation, f"{path}.{name}" if path else name, child)
    return found


def render() -> str:
    """The text of docs/config.md."""
    lines = [HEADER]
    for path, model, default in _sections(AdaRagConfig, "", None):
        leaves = {name: f for name, f in model.model_fields.items() if not _is_section(f)}
        if not leaves:
            continue
        title = f"`{path}`" if path else "Top level"
        doc = (model.__doc__ or "").strip().splitlines()
        lines += ["", f"## {title}", ""]
        if doc:
            lines += [f"{doc[0]} (`{model.__name__}`)", ""]
        lines += ["| setting | type | default | description |", "|---|---|---|---|"]
        for name, field in leaves.items():
            kind = _type_name(field.annotation)
            bounds = _bounds(field)
            if bounds:
                kind = f"{kind} ({bounds})"
            cells = (
                _code(name),
                _code(kind),
                _code(_default(field, default, name)),
                _cell(field.description or ""),
            )
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    """Write the reference; with ``--check``, only say whether the committed file is current."""
    text = render()
    if "--check" in sys.argv[1:]:
        if OUTPUT.read_text() != text:
            sys.stderr.write(f"{OUTPUT} is stale; run python scripts/config_docs.py\n")
            return 1
        return 0
    OUTPUT.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
