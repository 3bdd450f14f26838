"""Options shared by sub-commands, and the configuration they build."""

from __future__ import annotations

import argparse
import importlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

import annotated_types

from adarag.config import AdaRagConfig, RetrievalConfig, find_config_file, load_config_file
from adarag.errors import ConfigError, InputError, KnowledgeBaseError
from adarag.retrievers import KnowledgeBase
from adarag.retrievers.chunking import expand_paths
from adarag.schema import GenerationParams

_CONFIG_FIX = "fix the value in the configuration file or the override"
SOURCE_KEY = "source"  # the metadata key ingest stores each chunk's file path under


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """An argparse type: a whole number of at least 0."""
    return _int_at_least(text, 0)


def answer_tokens(text: str) -> int:
    """An argparse type: an answer length, from 1 to what ``GenerationParams`` accepts."""
    value = _int_at_least(text, 1)
    field = GenerationParams.model_fields["max_new_tokens"]
    most = next(
        cast(int, rule.le) for rule in field.metadata if isinstance(rule, annotated_types.Le)
    )
    if value > most:
        raise argparse.ArgumentTypeError(f"must be at most {most}, got {value}")
    return value


def _int_at_least(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
    return value


def check_input_paths(paths: Iterable[str | Path], option: str | None = None) -> None:
    """Refuse input paths that are missing or unreadable, before any model loads.

    Args:
        paths: Files or folders the command reads.
        option: The option that gave them (``"--data"``), named in the error; None for
            positional arguments.

    Raises:
        InputError: A path does not exist, is not a regular file or folder, or a folder holds no
            file ingest reads.
    """
    try:
        expand_paths(paths)
    except InputError as err:
        if option is None:
            raise
        raise InputError(f"{option}: {err}") from None


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """--model and --threads."""
    parser.add_argument(
        "--model",
        help="'default' (smollm2-135m), 'qwen2.5-coder-0.5b' or a local Hugging Face checkpoint "
        "directory",
    )
    parser.add_argument("--threads", type=positive_int, help="CPU threads for torch")


def add_knowledge_base_arguments(
    parser: argparse.ArgumentParser,
    *,
    default_collection: str | None = None,
    default_top_k: int | None = None,
) -> None:
    """--collection, --chroma-dir, --chroma-url, chunk sizes, --splitter, --top-k, --where.

    Args:
        parser: The command's parser.
        default_collection: The collection the command uses without ``--collection``; None:
            ``retrieval.collection``'s default.
        default_top_k: The chunks per question without ``--top-k`` (shown in the help);
            None: ``retrieval.top_k``'s default.
    """
    defaults = RetrievalConfig.model_fields
    default_collection = default_collection or defaults["collection"].default
    default_top_k = default_top_k or defaults["top_k"].default
    parser.add_argument("--collection", help=f"Chroma collection (default: {default_collection!r})")
    parser.add_argument("--chroma-dir", help="Chroma directory (default: <home>/chroma)")
    parser.add_argument(
        "--chroma-url",
        help="a Chroma server to use instead of a directory, e.g. http://127.0.0.1:8000 (start "
        "one with `chroma run --path DIR --port 8000`)",
    )
    parser.add_argument("--chunk-tokens", type=positive_int, help="model tokens per ingested chunk")
    parser.add_argument(
        "--chunk-overlap", type=non_negative_int, help="tokens shared by adjacent chunks"
    )
    parser.add_argument(
        "--splitter",
        type=splitter_choice,
        help="how ingest cuts documents: 'tokens' (windows), 'sentences', 'markdown' (sections "
        "then sentences; the default), or a LlamaIndex node parser or LangChain text splitter "
        "as MODULE:CLASS, e.g. llama_index.core.node_parser:SentenceSplitter",
    )
    parser.add_argument(
        "--splitter-option",
        action="append",
        metavar="KEY=VALUE",
        help="an argument of a MODULE:CLASS --splitter (repeat for several; VALUE read as JSON "
        "when it parses), e.g. chunk_size=256",
    )
    parser.add_argument(
        "--top-k",
        type=positive_int,
        help=f"chunks retrieved per question (default: {default_top_k})",
    )
    parser.add_argument(
        "--where",
        action="append",
        metavar="KEY=VALUE",
        help="retrieve only chunks with this metadata (repeat for several; VALUE read as JSON "
        "when it parses, e.g. chunk_idx=0, else as text)",
    )


BUILT_IN_SPLITTERS = ("tokens", "sentences", "markdown")


def splitter_choice(text: str) -> str:
    """An argparse type: a built-in splitter's name, or ``MODULE:CLASS``."""
    module, sep, name = text.partition(":")
    if text in BUILT_IN_SPLITTERS or (sep and module and name):
        return text
    raise argparse.ArgumentTypeError(
        f"expected tokens, sentences, markdown or MODULE:CLASS (e.g. "
        f"llama_index.core.node_parser:SentenceSplitter), got {text!r}"
    )


def external_splitter(args: argparse.Namespace) -> Any:
    """The ``MODULE:CLASS`` splitter of ``--splitter``, made with ``--splitter-option``; else None.

    Raises:
        InputError: The module or class cannot be imported, or options come without such a
            splitter.
    """
    given = getattr(args, "splitter", None)
    options = dict(
        _metadata_pair(item, "--splitter-option")
        for item in getattr(args, "splitter_option", None) or ()
    )
    if given is None or given in BUILT_IN_SPLITTERS:
        if options:
            raise InputError("--splitter-option applies to a --splitter given as MODULE:CLASS")
        return None
    module_name, _, name = given.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as err:
        raise InputError(
            f"--splitter {given}: cannot import {name} from {module_name} ({err}); install the "
            "package that provides it, or check the spelling"
        ) from err
    if not isinstance(found, type):
        if options:
            raise InputError(f"--splitter {given} is not a class; it takes no --splitter-option")
        return found
    try:
        return found(**options)
    except (TypeError, ValueError) as err:
        raise InputError(f"--splitter {given} with {options}: {err}") from err


_RETRIEVAL_ARGUMENTS = {
    "collection": "collection",
    "chroma_dir": "chroma_directory",
    "chroma_url": "chroma_url",
    "chunk_tokens": "chunk_tokens",
    "chunk_overlap": "chunk_overlap_tokens",
    "splitter": "splitter",
    "top_k": "top_k",
}


def build_config(
    args: argparse.Namespace, flags: dict[str, str] | None = None, **overrides: Any
) -> AdaRagConfig:
    """The configuration from its file, the model and knowledge-base options, and overrides.

    The file is ``--config``, else ``$ADARAG_CONFIG``, else ``$ADARAG_HOME/config.json`` when it
    exists (:func:`adarag.config.find_config_file`); options and overrides apply over it.

    Args:
        args: The parsed command line.
        flags: Config fields (``"cache.independent.recompute_ratio"``) the command set from an
            option of its own (``"--ratio"``) through ``overrides``.
        **overrides: Config sections to override.

    Raises:
        ConfigError: A value is invalid; a value that came from an option is named by the
            option.
    """
    source = find_config_file(getattr(args, "config", None))
    base = load_config_file(source) if source is not None else None
    from_flags = dict(flags or {})
    engine: dict[str, Any] = dict(overrides.pop("engine", {}))
    if getattr(args, "model", None):
        engine["model"] = args.model
        from_flags["engine.model"] = "--model"
    if getattr(args, "threads", None):
        engine["num_threads"] = args.threads
        from_flags["engine.num_threads"] = "--threads"
    retrieval: dict[str, Any] = dict(overrides.pop("retrieval", {}))
    for option, field in _RETRIEVAL_ARGUMENTS.items():
        value = getattr(args, option, None)
        if option == "splitter" and value not in BUILT_IN_SPLITTERS:
            continue  # MODULE:CLASS: passed to the knowledge base (external_splitter)
        if value is not None:
            retrieval[field] = getattr(args, option)
            from_flags[f"retrieval.{field}"] = "--" + option.replace("_", "-")
    if getattr(args, "where", None):
        retrieval["where"] = {
            key: _stored_source(value) if key == SOURCE_KEY else value
            for key, value in (_metadata_pair(item) for item in args.where)
        }
    try:
        config = AdaRagConfig.build(base, engine=engine, retrieval=retrieval, **overrides)
    except ConfigError as err:
        raise ConfigError(_name_options(str(err), from_flags)) from err
    # key files are read now, so one open to other users is refused before any model loads
    config.cache.store.signing_key_bytes()
    config.engine.handoff_key_bytes()
    return config


def _name_options(message: str, flags: dict[str, str]) -> str:
    """A config error that names the command-line options behind the bad values."""
    named = [flag for field, flag in flags.items() if f"{field}:" in message]
    for field, flag in flags.items():
        message = message.replace(f"{field}:", f"{flag} (config field {field}):")
    if named:
        message = message.replace(_CONFIG_FIX, f"fix {' and '.join(named)}")
    return message


def _metadata_pair(item: str, option: str = "--where") -> tuple[str, Any]:
    """``KEY=VALUE`` as (key, value), the value parsed as JSON when it parses.

    Raises:
        InputError: No ``=`` or an empty key.
    """
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise InputError(f"{option} takes KEY=VALUE, got {item!r} (e.g. {option} key=value)")
    try:
        return key.strip(), json.loads(value)
    except json.JSONDecodeError:
        return key.strip(), value


def _stored_source(value: Any) -> Any:
    """A ``source`` value as ingest stores it: a relative path resolved against the cwd."""
    if isinstance(value, str) and value and not Path(value).is_absolute():
        return str(Path(value).resolve())
    return value


def open_knowledge_base(
    config: AdaRagConfig, splitter: Any = None, *, allow_empty: bool = False
) -> KnowledgeBase:
    """The configured knowledge base, for reading; ``splitter`` cuts what it adds.

    Args:
        config: The configuration naming the collection.
        splitter: How documents added to it are cut (see :class:`KnowledgeBase`).
        allow_empty: Create the collection when it does not exist and accept it empty (a
            server, which documents are sent to); otherwise it is never created.

    Raises:
        KnowledgeBaseError: There is no such collection or it is empty (unless
            ``allow_empty``), or no chunk passes the metadata filter (``--where``).
    """
    kb = KnowledgeBase.from_config(config, create=allow_empty, splitter=splitter)
    if kb.count() == 0 and allow_empty:
        return kb
    if kb.count() == 0:
        kb.close()
        raise KnowledgeBaseError(
            f"the knowledge base (collection {config.retrieval.collection!r}) is empty; "
            "add documents first with `adarag ingest PATH...` (or run `adarag demo`)"
        )
    if not kb.has_filtered_chunks():
        count = kb.count()
        kb.close()
        given = " ".join(
            f"--where {key}={value}" for key, value in (config.retrieval.where or {}).items()
        )
        raise KnowledgeBaseError(
            f"the filter ({given}) matched no chunk of the {count} in collection "
            f"{config.retrieval.collection!r}; values must equal the stored metadata exactly "
            "(source is the file's absolute path, as `adarag ingest` stored it; a relative "
            "source= is resolved against the current directory). Fix or drop --where"
        )
    return kb
