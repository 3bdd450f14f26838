"""The report of ``serve-load``: throughput, TTFT and agreement per variant and client count."""

from __future__ import annotations

from adarag import AdaRagConfig
from adarag.engine.checkpoint import Checkpoint
from adarag.evaluation.intervals import bootstrap_interval, median_interval, ratio_of_medians
from adarag.evaluation.machine import describe_machine
from adarag.evaluation.metrics import token_f1


def agreement_with_vllm(results: dict, config: AdaRagConfig) -> None:
    """Each adarag answer against plain vLLM's answer to the same question (in place)."""
    if "vllm" not in results:
        return
    tokenizer = Checkpoint.open(config.engine.model, config.home).tokenizer
    reference = {
        r["question"]: tokenizer.decode(r["token_ids"], skip_special_tokens=True).strip()
        for level in results["vllm"]["levels"]
        for r in level["requests"]
    }
    for result in results.values():
        for level in result["levels"]:
            rows = level["requests"]
            exact = [r["text"].strip() == reference[r["question"]] for r in rows]
            level["exact"] = [float(e) for e in exact]
            f1 = [token_f1(r["text"], reference[r["question"]]) for r in rows]
            same_prompt = [r["prompt_tokens"] == r["expected_prompt_tokens"] for r in rows]
            level["summary"] |= {
                "exact_vs_vllm": sum(exact) / len(rows),
                "f1_vs_vllm": sum(f1) / len(rows),
                "same_prompt": sum(same_prompt) / len(rows),
            }


def serve_load_table(payload: dict) -> str:
    settings = payload["settings"]
    lines = [
        "# Many users: plain vllm serve vs vllm serve + adarag's connector vs adarag serve",
        "",
        describe_machine(payload["machine"]),
        "",
        f"Model {settings['model']}; a knowledge base of the {payload['num_passages']} 2WikiMQA "
        f"evidence passages of the questions asked, top-{settings['top_k']} per question in "
        f"similarity order (mean prompt {payload['mean_prompt_tokens']:.0f} tokens); a different "
        f"question per request; {settings['max_tokens']} greedy tokens; {settings['threads']} "
        "threads per process"
        + (
            f" ({settings['replica_threads']} for the vllm serve behind the connector)"
            if settings.get("replica_threads")
            else ""
        )
        + (
            f"; the vllm serve behind the connector at niceness {settings['replica_nice']}"
            if settings.get("replica_nice")
            else ""
        )
        + "; the variants one after another.",
        "",
        "| variant | clients | requests | requests/s | tokens/s | TTFT p50 [95% CI] | TTFT p95 | "
        "answers = vLLM's [95% CI] | token F1 vs vLLM | same prompt |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for variant, result in payload["variants"].items():
        for level in result["levels"]:
            s = level["summary"]
            p50 = median_interval([r["ttft_s"] for r in level["requests"]])
            exact = level.get("exact") or [0.0]
            agreement = bootstrap_interval([100.0 * e for e in exact])
            lines.append(
                f"| {variant} | {s['clients']} | {s['num_requests']} | "
                f"{s['requests_per_s']:.2f} | {s['tokens_per_s']:.1f} | "
                f"{p50.mean:.2f} s [{p50.low:.2f}, {p50.high:.2f}] | {s['ttft_p95_s']:.2f} s | "
                f"{agreement.mean:.0f}% [{agreement.low:.0f}, {agreement.high:.0f}] | "
                f"{s.get('f1_vs_vllm', 0):.2f} | {s.get('same_prompt', 0):.0%} |"
            )
    lines += ["", *_against_plain_vllm(payload)]
    starts = ", ".join(f"{v} {r['startup_s']:.1f} s" for v, r in payload["variants"].items())
    lines += ["", f"Start-up (all servers of a variant): {starts}."]
    return "\n".join(lines)


def _against_plain_vllm(payload: dict) -> list[str]:
    """Each variant's TTFT p50 and tokens/s as a ratio to plain vLLM's at the same client count."""
    variants = payload["variants"]
    if "vllm" not in variants:
        return []
    plain = {level["summary"]["clients"]: level for level in variants["vllm"]["levels"]}
    lines = [
        "Against plain vllm serve at the same client count (TTFT p50: plain vLLM's over the "
        "variant's, above 1 is sooner, 95% bootstrap interval over requests):",
        "",
        "| variant | clients | TTFT p50: times lower [95% CI] | tokens/s: times plain vLLM's |",
        "|---|---:|---:|---:|",
    ]
    for variant, result in variants.items():
        for level in result["levels"] if variant != "vllm" else ():
            reference = plain.get(level["summary"]["clients"])
            if reference is None:
                continue
            lower = ratio_of_medians(
                [r["ttft_s"] for r in reference["requests"]],
                [r["ttft_s"] for r in level["requests"]],
            )
            throughput = level["summary"]["tokens_per_s"] / reference["summary"]["tokens_per_s"]
            lines.append(
                f"| {variant} | {level['summary']['clients']} | "
                f"{lower.mean:.2f}x [{lower.low:.2f}, {lower.high:.2f}] | {throughput:.2f}x |"
            )
    return lines
