"""Answers through ``vllm serve`` + adarag's connector against the same server's own prefill.

Against a running ``vllm serve`` started with adarag's connector (any tensor-parallel size),
adarag's torch engine fuses each musique prompt (its first ``--passages`` passages; chunk KV
precomputed as ingest computes it) at every ``--ratios`` and hands the KV to the server through
the hand-over; the server's own answer to the same prompt (a fresh cache salt: it
computes every token) is the reference. Greedy answers of ``--max-tokens`` tokens are compared
token by token; the server's count of prompt tokens it did not compute shows the connector's
rows were used.

    python benchmarks/vllm_serve_agreement.py --url http://127.0.0.1:8000 \\
        --handoff /dev/shm/adarag-handoff --model qwen2.5-coder-0.5b --output NAME

with the replica's hand-over key in ``$ADARAG_HANDOFF_KEY`` (and its API key, if it requires
one, in ``$VLLM_API_KEY``), as docs/scaling.md starts it.
"""

from __future__ import annotations

import argparse
import json
import os
import uuid
from pathlib import Path

import httpx
from common import machine, musique_prompts, write_results

from adarag import AdaRAG
from adarag.evaluation.machine import describe_machine
from adarag.evaluation.reuse import reuse_sources
from adarag.schema import GenerationParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True, help="base URL of the vllm serve replica")
    parser.add_argument(
        "--handoff", required=True, help="the connector's handoff (directory or redis:// URL)"
    )
    parser.add_argument("--model", default="default")
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--passages", type=int, default=4)
    parser.add_argument("--ratios", type=float, nargs="+", default=[1.0, 0.2])
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--server-note", default="", help="how the server was started")
    parser.add_argument("--output", default="vllm_serve_agreement")
    args = parser.parse_args()

    api_key = os.environ.get("VLLM_API_KEY")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    served = httpx.get(f"{args.url}/v1/models", timeout=30, headers=headers).json()["data"][0]
    engine = {
        "model": args.model,
        "backend": "vllm-server",
        "vllm_server_urls": (args.url,),
        "vllm_handoff": args.handoff,
        "max_context_tokens": served["max_model_len"],
        "num_threads": args.threads,
    }
    rag = AdaRAG(engine=engine)
    engine, greedy = rag.engine, GenerationParams(max_new_tokens=args.max_tokens)
    rows = []
    for row, layout, system_kv, chunk_kvs in musique_prompts(
        rag, args.data_dir, args.questions, args.passages
    ):
        plain = engine.decoder.generate(layout.token_ids, greedy, uuid.uuid4().hex)
        record = {
            "id": row["id"],
            "prompt_tokens": layout.num_tokens,
            "server_alone": list(plain),
            "server_alone_cached": plain.num_cached_tokens,
        }
        for ratio in args.ratios:
            output = engine.prefill(
                layout, reuse_sources(system_kv, chunk_kvs, ratio), max_new_tokens=0
            )
            stream = engine.decode_tokens(layout, output, greedy)
            record[f"fused@{ratio}"] = list(stream)
            record[f"fused@{ratio}_cached"] = stream.num_cached_tokens
        rows.append(record)
        print(json.dumps(record))
    engine.close()
    payload = {"machine": machine(), "settings": vars(args), "server": served, "rows": rows}
    write_results(args.output, payload, _table(payload))


def _table(payload: dict) -> str:
    settings, rows = payload["settings"], payload["rows"]
    lines = [
        f"# Answers through vllm serve + adarag's connector ({payload['server']['root']})",
        "",
        describe_machine(payload["machine"]),
        "",
        f"{len(rows)} musique questions x {settings['passages']} passages (mean "
        f"{sum(r['prompt_tokens'] for r in rows) / len(rows):.0f} prompt tokens), "
        f"{settings['max_tokens']} greedy tokens; reference: the same server computing the "
        f"whole prompt itself. Server: {settings.get('server_note') or 'see the JSON'}.",
        "",
        "| adarag fused prefill | answers equal to the server's own | prompt tokens the server "
        "did not compute (mean) |",
        "|---|---|---|",
    ]
    for ratio in settings["ratios"]:
        key = f"fused@{ratio}"
        equal = sum(r[key] == r["server_alone"] for r in rows)
        cached = [r[f"{key}_cached"] or 0 for r in rows]
        lines.append(
            f"| ratio {ratio} | {equal}/{len(rows)} | {sum(cached) / len(rows):.0f} of "
            f"{sum(r['prompt_tokens'] for r in rows) / len(rows):.0f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
