"""Command-line options that build the configuration."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from adarag.cli.options import add_knowledge_base_arguments, build_config
from adarag.errors import ConfigError, InputError


def _parse(argv):
    parser = argparse.ArgumentParser()
    add_knowledge_base_arguments(parser)
    return parser.parse_args(argv)


def test_where_options_become_the_retrieval_filter_with_json_values():
    args = _parse(["--where", "title=Lothair", "--where", "chunk_idx=0", "--where", "x=true"])
    assert build_config(args).retrieval.where == {"title": "Lothair", "chunk_idx": 0, "x": True}
    assert build_config(_parse([])).retrieval.where is None


@pytest.mark.parametrize("item", ["title", "=value"])
def test_a_where_option_without_key_and_value_is_a_clear_error(item):
    with pytest.raises(InputError, match="--where takes KEY=VALUE"):
        build_config(_parse(["--where", item]))


def test_every_example_in_the_help_parses():
    # the top-level help is for users: each example it shows is a valid command line
    from adarag.cli import EXAMPLES, build_parser

    parser = build_parser()
    commands = [line.split("  ")[1].strip() for line in EXAMPLES.splitlines()[1:] if "  " in line]
    commands = [c for c in commands if c.startswith("adarag ")]
    assert len(commands) == 7
    for command in commands:
        args = parser.parse_args(shlex.split(command)[1:])
        assert args.command == shlex.split(command)[1]


def test_a_source_names_its_file_chunk_and_title(tmp_path, monkeypatch):
    from adarag.cli.display import _label
    from adarag.schema import Chunk

    monkeypatch.chdir(tmp_path)
    metadata = {"source": str(tmp_path / "notes" / "a.md"), "chunk_idx": 2, "file_num_chunks": 7}
    chunk = Chunk("text", chunk_id="c1", score=0.5, metadata={**metadata, "title": "Lyon"})
    assert _label(chunk) == "[0.50] notes/a.md, chunk 3/7, 'Lyon'"
    elsewhere = Chunk("text", chunk_id="c2", metadata={"source": "/elsewhere/b.md"})
    assert _label(elsewhere) == "/elsewhere/b.md"
    assert _label(Chunk("text", chunk_id="c3")) == "c3"


def test_a_bad_option_value_is_named_by_its_option():
    # a value from a command-line option is reported as that option, not as a config field
    with pytest.raises(ConfigError, match=r"--top-k \(config field retrieval.top_k\).*fix --top-k"):
        build_config(_parse(["--chunk-overlap", "400", "--top-k", "65"]))
    args = _parse([])
    with pytest.raises(ConfigError, match=r"--ratio \(config field .*recompute_ratio\)"):
        build_config(
            args,
            {"cache.independent.recompute_ratio": "--ratio"},
            cache={"independent": {"recompute_ratio": 2.0}},
        )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["ask", "q?", "f.txt", "--max-new-tokens", "0"], "--max-new-tokens: must be at least 1"),
        (["chat", "--history-turns", "-1"], "--history-turns: must be at least 0"),
        (["chat", "--top-k", "two"], "--top-k: expected a whole number, got 'two'"),
    ],
)
def test_numeric_options_are_checked_when_parsed(argv, message, capsys):
    from adarag.cli import build_parser

    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_a_bad_serve_option_is_named_before_anything_loads(capsys):
    from adarag.cli import main

    assert main(["serve", "--timeout", "0", "--max-queued", "5"]) == 2
    error = capsys.readouterr().err
    assert "--timeout (config field serve.request_timeout_s)" in error and "fix --timeout" in error


@pytest.mark.parametrize(
    "argv",
    [
        ["--config", "c.json", "-v", "chat"],
        ["chat", "--config", "c.json", "-v"],
        ["-v", "chat", "--config", "c.json"],
    ],
)
def test_config_and_verbose_are_taken_before_or_after_the_command(argv):
    from adarag.cli import build_parser

    args = build_parser().parse_args(argv)
    assert (args.command, args.config, args.verbose) == ("chat", "c.json", True)


def test_without_config_and_verbose_the_defaults_hold():
    from adarag.cli import build_parser

    args = build_parser().parse_args(["chat"])
    assert (args.config, args.verbose) == (None, False)


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["--max-body-bytes", "10"], "serve.max_request_body_bytes"),
        (["--body-timeout", "0"], "serve.body_read_timeout_s"),
    ],
)
def test_a_bad_request_limit_option_is_named_before_anything_loads(capsys, argv, field):
    from adarag.cli import main

    assert main(["serve", *argv]) == 2
    error = capsys.readouterr().err
    assert f"{argv[0]} (config field {field})" in error and f"fix {argv[0]}" in error


def test_a_malformed_vllm_url_is_refused_before_anything_loads(capsys):
    from adarag.cli import main

    assert main(["serve", "--vllm-url", "vllm-host:8000"]) == 2
    assert "must look like http://host:port" in capsys.readouterr().err


def _run_cli(tmp_path, *argv):
    """``adarag ARGV`` in a fresh interpreter; its stdout ends saying whether torch loaded."""
    code = (
        "import sys; from adarag.cli import main; status = main(sys.argv[1:]); "
        "print('torch loaded' if 'torch' in sys.modules else 'torch not loaded'); sys.exit(status)"
    )
    root = str(Path(__file__).resolve().parents[2])  # this checkout's adarag, from any cwd
    path = os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "ADARAG_HOME": str(tmp_path / "home"), "PYTHONPATH": path}
    return subprocess.run(
        [sys.executable, "-c", code, *argv],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=60,
    )


def test_a_missing_ingest_path_is_refused_at_once_without_loading_torch(tmp_path):
    """Regression: `adarag ingest no_such_file.md` loaded the models (11 s) before refusing."""
    result = _run_cli(tmp_path, "ingest", "no_such_file.md")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "adarag ingest: error: no_such_file.md does not exist; pass files or folders of documents"
    ]
    # refused before torch (and so any model) loads; its time is measured, not asserted
    assert result.stdout.strip() == "torch not loaded"
    assert not (tmp_path / "home").exists()  # nothing was created either


def test_strict_ingest_names_every_file_left_out_before_torch_loads(tmp_path):
    """A folder with a damaged, an encrypted and a scanned PDF, a hidden file and two other
    types: --strict names all six, and exits before any model loads or collection is made."""
    pytest.importorskip("pypdf")
    pytest.importorskip("docx")
    pytest.importorskip("trafilatura")
    from tests.unit.retrievers.messy_documents import messy_folder

    messy_folder(tmp_path / "kb")
    result = _run_cli(tmp_path, "ingest", "--strict", "kb")
    assert result.returncode == 2, result.stderr
    (error,) = [line for line in result.stderr.splitlines() if "error:" in line]
    assert error.startswith("adarag ingest: error: 6 file(s) are not read or hold no text: ")
    for name in (".hidden.md", "notes.xyz", "photo.png", "cut.pdf", "locked.pdf", "scan.pdf"):
        assert f"{tmp_path / 'kb' / name} (" in error, name
    assert result.stdout.strip() == "torch not loaded"
    assert not (tmp_path / "home").exists()  # no knowledge base, no collection


def test_an_unsupported_file_given_by_name_gets_the_same_message_everywhere(tmp_path):
    from adarag.retrievers.file_types import unsupported_type_message

    (tmp_path / "notes.xyz").write_text("words")
    result = _run_cli(tmp_path, "ingest", "notes.xyz")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"adarag ingest: error: {unsupported_type_message('notes.xyz')}"
    ]
    assert result.stdout.strip() == "torch not loaded"


def test_a_splitter_given_as_module_and_class_is_made_with_its_options():
    pytest.importorskip("llama_index.core")
    from adarag.cli.options import external_splitter

    args = _parse(
        ["--splitter", "llama_index.core.node_parser:SentenceSplitter"]
        + ["--splitter-option", "chunk_size=64", "--splitter-option", "chunk_overlap=8"]
    )
    splitter = external_splitter(args)
    assert (type(splitter).__name__, splitter.chunk_size, splitter.chunk_overlap) == (
        "SentenceSplitter",
        64,
        8,
    )
    assert build_config(args).retrieval.splitter == "markdown"  # the built-in stays the default
    assert external_splitter(_parse(["--splitter", "sentences"])) is None
    assert build_config(_parse(["--splitter", "sentences"])).retrieval.splitter == "sentences"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["profile", "--data", "missing.jsonl"], "--data: missing.jsonl does not exist"),
        (["bench", "--data-dir", "missing"], "--data-dir: missing does not exist"),
    ],
)
def test_input_path_options_are_checked_before_a_model_loads(argv, message, capsys, tmp_path):
    from adarag.cli import main

    assert main([*argv, "--model", str(tmp_path / "no-model-here")]) == 2
    assert message in capsys.readouterr().err  # not the missing model, which is loaded later


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--splitter", "no_such_module:Splitter"], "cannot import Splitter from no_such_module"),
        (["--splitter", "tokens", "--splitter-option", "chunk_size=8"], "applies to a --splitter"),
        (["--splitter", "os.path:join", "--splitter-option", "a=1"], "is not a class"),
    ],
)
def test_a_splitter_that_cannot_be_made_is_a_clear_error(argv, message):
    from adarag.cli.options import external_splitter

    with pytest.raises(InputError, match=message):
        external_splitter(_parse(argv))


def test_a_splitter_that_is_neither_built_in_nor_module_and_class_is_refused(capsys):
    with pytest.raises(SystemExit) as exited:
        _parse(["--splitter", "paragraphs"])
    assert exited.value.code == 2
    assert "expected tokens, sentences, markdown or MODULE:CLASS" in capsys.readouterr().err


def _commands():
    from adarag.cli import build_parser

    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return parser, commands.choices


def test_every_option_of_every_command_says_what_it_does():
    _, commands = _commands()
    missing = [
        f"{name} {action.option_strings[0]}"
        for name, command in commands.items()
        for action in command._actions
        if action.option_strings and not action.help
    ]
    assert missing == []


def test_the_help_names_the_defaults_that_hold():
    from adarag.config import AdaRagConfig

    parser, commands = _commands()
    assert "until the model is confident" not in parser.description.split(";")[0]
    assert "top-k" in parser.description and "opt-in" in parser.description
    demo = commands["demo"].format_help()
    assert "Chroma collection (default: 'adarag-demo')" in demo
    assert "(default: 4)" in demo and "answer tokens generated at most" in demo
    assert commands["demo"].parse_args([]).collection == "adarag-demo"
    ask = commands["ask"].format_help()
    assert f"(default: {AdaRagConfig().retrieval.collection!r})" in ask
    assert f"(default: {AdaRagConfig().retrieval.top_k})" in ask


def test_serve_starts_over_a_knowledge_base_never_ingested(
    tiny_checkpoints, tmp_path, monkeypatch, capsys
):
    import adarag.retrievers.knowledge_base as knowledge_base
    from adarag.cli import main
    from adarag.serve import AdaRagServer
    from tests.unit.retrievers.test_knowledge_base import WordEmbedder

    pytest.importorskip("chromadb")
    monkeypatch.setenv("ADARAG_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(knowledge_base, "SentenceEmbedder", lambda *_args: WordEmbedder())
    started = []
    monkeypatch.setattr(AdaRagServer, "run", lambda server: started.append(server))
    argv = ["serve", "--model", str(tiny_checkpoints["llama"]), "--model-name", "tiny"]
    assert main([*argv, "--collection", "fresh", "--port", "0"]) == 0
    assert len(started) == 1
    out = capsys.readouterr().out
    assert "serving 0 chunks of 'fresh'" in out
