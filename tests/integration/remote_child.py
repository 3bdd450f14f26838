"""Another process sharing the KV tier: warms chunks into it and reports its store's counts.

``python -m tests.integration.remote_child CONFIG_JSON PASSAGES_JSON`` prints one JSON line:
the number of chunks it computed and its store's statistics.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from adarag import AdaRAG, AdaRagConfig


def main(config_path: str, passages_path: str) -> int:
    passages = json.loads(Path(passages_path).read_text())
    with AdaRAG(AdaRagConfig.from_file(config_path)) as rag:
        computed = rag.warm(passages)
        stats = dataclasses.asdict(rag.cache_stats().store)
    sys.stdout.write(json.dumps({"computed": computed, "store": stats}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
