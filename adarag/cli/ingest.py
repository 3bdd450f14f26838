"""``adarag ingest``: files into the Chroma knowledge base, each new chunk's KV precomputed."""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

from adarag.cli.options import (
    add_knowledge_base_arguments,
    add_model_arguments,
    build_config,
    external_splitter,
)
from adarag.errors import CacheError
from adarag.retrievers import IngestReport, KnowledgeBase
from adarag.retrievers.file_types import supported_types
from adarag.retrievers.gathering import GatheredFiles, gather_files, read_file
from adarag.retrievers.paths import SkippedFile
from adarag.schema import Chunk

if TYPE_CHECKING:
    from adarag.pipeline import AdaRAG

HELP = (
    "add documents (text, markdown, JSONL passages, PDF, HTML, Word .docx, CSV) to the Chroma "
    "knowledge base, warming their KV; files that are not read are listed with their reasons"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the command's options."""
    parser.add_argument(
        "paths",
        nargs="+",
        help=f"files or folders of {supported_types()} files (a folder's other files, hidden "
        "files and files that cannot be read are listed as skipped, with their reasons)",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="refuse to ingest anything when a file is skipped, cannot be read or holds no text "
        "(every one is named)",
    )
    parser.add_argument("--no-warm", action="store_true", help="skip precomputing chunk KV")
    parser.add_argument(
        "--prune",
        action="store_true",
        help="also remove the chunks of previously ingested files that no longer exist",
    )
    add_knowledge_base_arguments(parser)
    add_model_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Ingest, warm, and print what changed."""
    config = build_config(args)
    # every file is read (and --strict decided) before torch and the models load
    read = partial(read_file, config=config.retrieval)
    gathered = gather_files(args.paths, read, strict=args.strict)
    from adarag.pipeline import AdaRAG

    splitter = external_splitter(args)
    rag = AdaRAG(config)
    with KnowledgeBase.from_config(config, splitter=splitter) as kb:
        ingest_and_warm(rag, kb, gathered, warm=not args.no_warm)
        if args.prune:
            pruned = kb.prune_missing_sources()
            print(
                f"pruned {sum(pruned.values())} chunk(s) of {len(pruned)} missing file(s); "
                f"collection {kb.config.collection!r} holds {kb.count()} chunks"
            )
            for source in sorted(pruned):
                print(f"  {source}: {pruned[source]} chunk(s)")
    return 0


def ingest_and_warm(
    rag: AdaRAG,
    kb: KnowledgeBase,
    paths: Iterable[str | Path] | GatheredFiles,
    *,
    warm: bool = True,
    strict: bool = False,
) -> IngestReport:
    """Ingest ``paths`` into ``kb`` with a progress bar, then warm the added chunks' KV.

    ``paths`` may be files already read (:func:`~adarag.retrievers.gathering.gather_files`).
    """
    started = time.perf_counter()
    with tqdm(desc="embedding chunks", unit="chunk", leave=False) as bar:

        def on_progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        if isinstance(paths, GatheredFiles):
            report = kb.ingest_gathered(paths, tokenizer=rag.tokenizer, on_progress=on_progress)
        else:
            report = kb.ingest(
                paths, tokenizer=rag.tokenizer, on_progress=on_progress, strict=strict
            )
    print(
        f"ingested {report.num_files} file(s), {report.num_files_unchanged} unchanged: "
        f"{len(report.added)} chunks added, {report.num_chunks_kept} kept, "
        f"{report.num_chunks_removed} removed in {time.perf_counter() - started:.1f} s; "
        f"collection {kb.config.collection!r} holds {kb.count()} chunks"
        + (f" ({kb.directory})" if kb.directory else "")
    )
    _print_left_out("skipped", report.skipped)
    _print_left_out("could not read", report.unreadable)
    _print_left_out("no text in", report.empty)
    if warm and report.sources:
        # every chunk of these files, not only the added ones: a run stopped after the chunks
        # were stored but before their KV was (a crash, ^C) is completed here
        warm_chunks(rag, kb.chunks(sources=report.sources))
    return report


def _print_left_out(what: str, files: Sequence[SkippedFile]) -> None:
    """``skipped 2 file(s):`` then one indented line per file with its reason."""
    if files:
        print(f"{what} {len(files)} file(s):")
        for item in files:
            print(f"  {item}")


def warm_chunks(rag: AdaRAG, chunks: Sequence[Chunk], desc: str = "warming chunk KV") -> int:
    """Precompute the independent KV of ``chunks`` with a progress bar; returns how many.

    Raises:
        CacheError: The KV cache directory stopped taking writes (a full or read-only file
            system): warming is for the disk, so it stops there. What is stored stays.
    """
    started = time.perf_counter()
    computed = 0
    for chunk in tqdm(chunks, desc=desc, unit="chunk", leave=False):
        computed += rag.warm([chunk])
        problem = rag.cache_disk_problem
        if problem is not None:
            raise CacheError(
                f"cannot write chunk KV to {rag.kv_directory}: {problem}; {computed} chunk(s) "
                "were warmed, the chunks stay in the knowledge base; free space (or make the "
                "directory writable, or set cache.store.directory) and run `adarag ingest` "
                "again to warm the rest"
            )
    print(
        f"precomputed the KV of {computed} chunk(s) ({len(chunks) - computed} already cached) "
        f"in {time.perf_counter() - started:.1f} s"
    )
    return computed
