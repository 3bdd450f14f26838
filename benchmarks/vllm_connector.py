"""adarag's vLLM connector: TTFT in process, ``vllm serve`` under load, and the served answers.

``ttft``: TTFT on vLLM, adarag's connector vs vLLM's full prefill vs vLLM's automatic prefix
caching. On musique passages (6 per question, ~3.7K tokens), with the real model and one
in-process vLLM engine. Each chunk's independent KV is precomputed (untimed, as the ingest path
does); the system prefix KV is an exact hit. Variants, all timed from request to first generated
token:

- ``vllm_full``: vLLM computes the whole prompt (a fresh cache salt: no prefix-cache hit);
- ``vllm_prefix_cache``: the second identical request (hit on every full block);
- ``connector@r``: adarag's fused prefill at ratio r over vLLM's own layers, then vLLM's first
  step with the fused KV of all prompt tokens but the last handed through the connector.

All variants of one question run back to back, interleaved, so machine noise hits them alike.

``serve-load``: many users on one machine, plain ``vllm serve`` vs ``vllm serve`` + adarag's
connector (behind ``adarag serve --vllm-url``) vs ``adarag serve`` on its torch engine, at 1, 4
and 16 clients. The workload shares knowledge-base chunks in different orders. The knowledge base
holds the evidence passages of every 2WikiMQA question asked (``adarag ingest`` precomputes their
chunk KV once); each request is a different question, whose top ``--top-k`` chunks (its evidence
among other questions' passages) come in its own similarity order, so prompts share no prefix
beyond the system prompt unless their first chunks agree. Every prompt is computed once in this
process (the pipeline's retrieval and layout) so that plain vLLM receives exactly the token ids
adarag builds; each adarag reply's ``usage.prompt_tokens`` is checked against them.

Variants, one after another, each alone on the machine:

- ``vllm``: ``vllm serve`` (prefix caching on) answers the token ids through ``/v1/completions``;
- ``connector``: ``adarag serve --vllm-url`` (retrieval, chunk KV, fused prefill at the default
  ratio, the first token) in front of ``vllm serve`` with adarag's connector (decoding,
  batching), which runs at ``--replica-nice`` (19: the front end's prefills come first on the
  shared cores);
- ``connector@1.0``: the same at ratio 1.0 with a float32 store (the system prompt's hard hit
  is not rounded either), 1 client only: its answers must equal ``vllm``'s;
- ``adarag``: ``adarag serve --batch-decode`` (torch engine).

Each client count gets its own questions (the first ``--requests N`` after the previous
level's), ``--max-tokens`` greedy tokens, each client sending its next request when its last
ended. TTFT is measured by the client, to the first streamed token; its median comes with a
95% bootstrap interval over requests, as does each variant's ratio to plain vLLM's. Agreement:
an adarag answer's text against plain vLLM's answer to the same prompt (decoded with the same
tokenizer), with its interval.

``serve-agreement``: answers through ``vllm serve`` + adarag's connector against the same
server's own prefill. Against a running ``vllm serve`` started with adarag's connector (any
tensor-parallel size), adarag's torch engine fuses each musique prompt (its first ``--passages``
passages; chunk KV precomputed as ingest computes it) at every ``--ratios`` and hands the KV to
the server through the hand-over; the server's own answer to the same prompt (a fresh cache salt:
it computes every token) is the reference. Greedy answers of ``--max-tokens`` tokens are compared
token by token; the server's count of prompt tokens it did not compute shows the connector's rows
were used. The replica's hand-over key is read from ``$ADARAG_HANDOFF_KEY`` (and its API key, if
it requires one, from ``$VLLM_API_KEY``), as docs/scaling.md starts it.

    python benchmarks/vllm_connector.py ttft --questions 5
    python benchmarks/vllm_connector.py serve-load --output vllm_serve_load
    python benchmarks/vllm_connector.py serve-load --tables-only --output vllm_serve_load
    python benchmarks/vllm_connector.py serve-agreement --url http://127.0.0.1:8000 \
        --handoff /dev/shm/adarag-handoff --model qwen2.5-coder-0.5b --output NAME
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common import run_subcommand
from runs.vllm_connector.serve_agreement import serve_agreement
from runs.vllm_connector.serve_load import vllm_serve_load
from runs.vllm_connector.ttft import connector_ttft


def _add_ttft(sub: argparse._SubParsersAction) -> None:
    command = sub.add_parser(
        "ttft", help="TTFT: the connector, vLLM's full prefill and its prefix cache"
    )
    command.add_argument("--questions", type=int, default=5)
    command.add_argument("--passages", type=int, default=6)
    command.add_argument("--repeats", type=int, default=2, help="timed runs per variant")
    command.add_argument("--ratios", type=float, nargs="+", default=[0.15])
    command.add_argument("--threads", type=int, help="torch/OpenMP threads (default: torch's)")
    command.add_argument("--kv-cache-gib", type=float, default=2.0)
    command.add_argument("--data-dir", type=Path)
    command.add_argument("--output", default="vllm_ttft", help="results/vllm/<output>.{md,json}")
    command.set_defaults(fn=connector_ttft)


def _add_serve_load(sub: argparse._SubParsersAction) -> None:
    command = sub.add_parser(
        "serve-load", help="plain vllm serve, with the connector, and adarag serve at 1-16 clients"
    )
    command.add_argument("--model", default="default")
    command.add_argument("--top-k", type=int, default=8)
    command.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    command.add_argument(
        "--requests", type=int, nargs="+", default=[8, 32, 48], help="per client count"
    )
    command.add_argument("--max-tokens", type=int, default=32)
    command.add_argument("--threads", type=int, default=2, help="each process's CPU threads")
    command.add_argument(
        "--replica-threads",
        type=int,
        help="threads of the vllm serve behind the connector (default: --threads); plain vLLM "
        "always gets --threads",
    )
    command.add_argument(
        "--replica-nice",
        type=int,
        default=19,
        help="niceness of the vllm serve behind the connector: the front end's fused prefills "
        "on the same cores go first, as docs/scaling.md advises on one machine (plain vLLM "
        "always runs at 0)",
    )
    command.add_argument("--max-model-len", type=int, default=4096)
    command.add_argument(
        "--variants", nargs="+", default=["vllm", "connector@1.0", "connector", "adarag"]
    )
    command.add_argument("--data-dir", type=Path)
    command.add_argument("--output", default="vllm_serve_load")
    command.add_argument(
        "--tables-only", action="store_true", help="rewrite --output's .md from its .json, no run"
    )
    command.set_defaults(fn=vllm_serve_load)


def _add_serve_agreement(sub: argparse._SubParsersAction) -> None:
    command = sub.add_parser(
        "serve-agreement", help="answers through vllm serve + the connector against its own"
    )
    command.add_argument("--url", required=True, help="base URL of the vllm serve replica")
    command.add_argument(
        "--handoff", required=True, help="the connector's handoff (directory or redis:// URL)"
    )
    command.add_argument("--model", default="default")
    command.add_argument("--questions", type=int, default=8)
    command.add_argument("--passages", type=int, default=4)
    command.add_argument("--ratios", type=float, nargs="+", default=[1.0, 0.2])
    command.add_argument("--max-tokens", type=int, default=16)
    command.add_argument("--threads", type=int, default=2)
    command.add_argument("--data-dir", type=Path)
    command.add_argument("--server-note", default="", help="how the server was started")
    command.add_argument("--output", default="vllm_serve_agreement")
    command.set_defaults(fn=serve_agreement)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_ttft(sub)
    _add_serve_load(sub)
    _add_serve_agreement(sub)
    run_subcommand(parser)


if __name__ == "__main__":
    main()
