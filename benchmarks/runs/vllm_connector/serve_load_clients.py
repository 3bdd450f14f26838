"""The clients of ``serve-load``: streamed requests, each client sending one at a time."""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import httpx
from common import load_summary


async def run_level(
    variant: str, url: str, clients: int, prompts: list[dict], args: argparse.Namespace
) -> dict:
    """Every prompt once, over ``clients`` clients each sending one request at a time."""
    per_client = [prompts[i::clients] for i in range(clients)]

    async def one_client(client: httpx.AsyncClient, mine: list[dict]) -> list[dict]:
        return [await _request(variant, client, url, prompt, args) for prompt in mine]

    async with httpx.AsyncClient(timeout=httpx.Timeout(900.0)) as client:
        started = time.perf_counter()
        groups = await asyncio.gather(*(one_client(client, mine) for mine in per_client))
        wall_s = time.perf_counter() - started
    results = [r for group in groups for r in group]
    tokens = sum(r["completion_tokens"] for r in results)
    return {"requests": results, "summary": load_summary(results, clients, wall_s, tokens)}


async def _request(
    variant: str, client: httpx.AsyncClient, url: str, prompt: dict, args: argparse.Namespace
) -> dict:
    """One streamed request; TTFT to its first token, its answer and usage."""
    common = {"max_tokens": args.max_tokens, "temperature": 0.0, "stream": True}
    common["stream_options"] = {"include_usage": True}
    if variant == "vllm":
        route = f"{url}/v1/completions"
        body = {**common, "model": await _model_id(client, url), "prompt": prompt["token_ids"]}
        body |= {"return_token_ids": True, "skip_special_tokens": True}
    else:
        route = f"{url}/v1/chat/completions"
        body = {**common, "model": "adarag"}
        body["messages"] = [{"role": "user", "content": prompt["question"]}]
    started = time.perf_counter()
    ttft_s, text, token_ids, usage = None, [], [], {}
    async with client.stream("POST", route, json=body) as reply:
        assert reply.status_code == 200, (await reply.aread()).decode()[:500]
        async for line in reply.aiter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            event = json.loads(line[len("data:") :])
            usage = event.get("usage") or usage
            for choice in event.get("choices") or ():
                delta = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
                ids = choice.get("token_ids") or []
                if ttft_s is None and (delta or ids):
                    ttft_s = time.perf_counter() - started
                text.append(delta)
                token_ids.extend(ids)
    latency_s = time.perf_counter() - started
    return {
        "question": prompt["question"],
        "ttft_s": ttft_s if ttft_s is not None else latency_s,
        "latency_s": latency_s,
        "completion_tokens": usage.get("completion_tokens", 0),
        "prompt_tokens": usage.get("prompt_tokens"),
        "expected_prompt_tokens": len(prompt["token_ids"]),
        "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
        "text": "".join(text),
        "token_ids": token_ids,
    }


_MODEL_IDS: dict[str, str] = {}


async def _model_id(client: httpx.AsyncClient, url: str) -> str:
    if url not in _MODEL_IDS:
        _MODEL_IDS[url] = (await client.get(f"{url}/v1/models")).json()["data"][0]["id"]
    return _MODEL_IDS[url]
