"""``adarag setup``: provision the default model (convert the bundled GGUF once)."""

from __future__ import annotations

import argparse

from adarag.cli.options import add_model_arguments, build_config
from adarag.engine.provision import resolve_checkpoint

HELP = "provision the model checkpoint (converts a named model's packaged GGUF once)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the command's options."""
    add_model_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Convert (if needed) and print the checkpoint directory."""
    config = build_config(args)
    print(f"model checkpoint: {resolve_checkpoint(config.engine.model, config.home)}")
    return 0
