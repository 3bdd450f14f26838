"""Command-line options that build the configuration."""

from __future__ import annotations

import argparse
import shlex

import pytest

from adarag.cli.options import add_knowledge_base_arguments, build_config
from adarag.errors import InputError


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
    assert len(commands) == 5
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
