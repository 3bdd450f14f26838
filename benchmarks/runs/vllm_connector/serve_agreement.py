"""``vllm_connector.py serve-agreement``: answers through vllm serve + the connector vs its own."""

from __future__ import annotations

import argparse
import json
import os
import uuid
from pathlib import Path

import httpx
from common import machine, musique_prompts, write_results

from adarag import AdaRAG
from adarag.engine.prefill_request import PrefillRequest
from adarag.evaluation.machine import describe_machine
from adarag.evaluation.reuse import reuse_sources
from adarag.schema import GenerationParams
from runs.vllm_connector import OUTPUT


def _agreement_table(payload: dict) -> str:
    settings, rows = payload["settings"], payload["rows"]
    served = Path(payload["server"]["root"]).name
    lines = [
        f"# Answers through vllm serve + adarag's connector ({served})",
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


def serve_agreement(args: argparse.Namespace) -> None:
    """The ``serve-agreement`` subcommand."""

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
                PrefillRequest(layout, reuse_sources(system_kv, chunk_kvs, ratio), max_new_tokens=0)
            )
            stream = engine.decode_tokens(layout, output, greedy)
            record[f"fused@{ratio}"] = list(stream)
            record[f"fused@{ratio}_cached"] = stream.num_cached_tokens
        rows.append(record)
        print(json.dumps(record))
    engine.close()
    payload = {"machine": machine(), "settings": vars(args), "server": served, "rows": rows}
    write_results(args.output, payload, _agreement_table(payload), directory=OUTPUT)
