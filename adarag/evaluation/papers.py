"""The related systems' published results, next to what their policies measured here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

RAGBOOST_NOTES = {
    "multi-user": (
        "RAGBoost (multi-session, MultihopRAG, k=15, H100): prefix-cache hit rate 8.5% "
        "(SGLang RadixCache) -> 20.6% (ordering) -> 34.0% (+ scheduling) with Qwen3-32B; "
        "F1 46.1 (RadixCache) vs 50.2 (RAGBoost) with Qwen3-4B, CacheBlend 39.8."
    ),
    "multi-turn": (
        "RAGBoost (MT-RAG multi-turn, Qwen3-4B, one H100): TTFT 0.44 s (RadixCache) vs "
        "0.22 s (RAGBoost), 2.0x; LLM-judge accuracy 62.56 vs 64.27, CacheBlend 50.33."
    ),
}
FUSIONRAG_NOTE = (
    "FusionRAG (Musique, ~27K-token prompts, 7-14B models on L20 GPUs, 15% recomputed): TTFT "
    "2.66-3.94x below full attention; Normalized-F1 = (F1 - F1 at ratio 0) / (F1 of full - F1 "
    "at ratio 0) of 56-100% on the multi-hop sets, CacheBlend 6% (Qwen3-32B, HotpotQA)."
)
CACHECRAFT_NOTE = (
    "Cache-Craft (LLaMA-3-8B/70B on A100s; production traces and 2WikiMQA): ROUGE-L against "
    "the full-recompute answer 0.87 with 20% recomputed (production), 0.89 with 30% "
    "(2WikiMQA); 51% fewer tokens computed than prefix caching; TTFT 2.5x below prefix caching "
    "with 39% recomputed."
)
A3_NOTE = (
    "A3 (LongBench, LLaMA3-8B, ratio presumably 0.15): average score 96.1% of full prefill's, "
    "CacheBlend's at the same ratio lower (largest gains on single- and multi-document QA); "
    "'2x TTFT reduction' (abstract, no setting stated)."
)


class PolicyFigures(Protocol):
    """What a policy's row of a workload holds (``adarag.evaluation.side_by_side.PolicyRow``)."""

    @property
    def ttft_mean_s(self) -> float: ...  # noqa: D102
    @property
    def recomputed_tokens(self) -> float: ...  # noqa: D102
    @property
    def reused_token_share(self) -> float: ...  # noqa: D102
    @property
    def tier_share(self) -> dict[str, float]: ...  # noqa: D102
    @property
    def gold_f1(self) -> float: ...  # noqa: D102
    @property
    def f1_agreement(self) -> float: ...  # noqa: D102


def paper_lines(workload: str, by_name: Mapping[str, PolicyFigures]) -> list[str]:
    """Each related system's published result next to ours on this workload (markdown lines)."""
    full = by_name["full"]
    lines: list[str] = []
    if "ragboost" in by_name and "prefix" in by_name and workload in RAGBOOST_NOTES:
        ours, prefix = by_name["ragboost"], by_name["prefix"]
        lines += [
            f"- **RAGBoost** paper: {RAGBOOST_NOTES[workload]}",
            f"  here: reused prompt tokens {prefix.reused_token_share:.1f}% (prefix) -> "
            f"{ours.reused_token_share:.1f}% (ragboost); hard-tier chunk hits "
            f"{prefix.tier_share['hard']:.0f}% -> {ours.tier_share['hard']:.0f}%; mean TTFT "
            f"{prefix.ttft_mean_s:.3f} s -> {ours.ttft_mean_s:.3f} s "
            f"({_speedup(prefix, ours)}); gold F1 {prefix.gold_f1:.1f} -> {ours.gold_f1:.1f}.",
        ]
    if "fusionrag" in by_name and "promptcache" in by_name:
        ours, zero = by_name["fusionrag"], by_name["promptcache"]
        blend = by_name.get("cacheblend")
        blend_text = (
            f" (cacheblend {_normalized(blend.gold_f1, zero.gold_f1, full.gold_f1)} and "
            f"{_normalized(blend.f1_agreement, zero.f1_agreement, 100.0)})"
            if blend
            else ""
        )
        lines += [
            f"- **FusionRAG** paper: {FUSIONRAG_NOTE}",
            f"  here: TTFT speed-up over full {_speedup(full, ours)} with "
            f"{100 - ours.reused_token_share:.1f}% of prompt tokens recomputed; Normalized-F1 "
            f"(ratio 0 = promptcache) {_normalized(ours.gold_f1, zero.gold_f1, full.gold_f1)} "
            f"on gold F1 and {_normalized(ours.f1_agreement, zero.f1_agreement, 100.0)} on "
            f"F1 agreement with full{blend_text}.",
        ]
    if "cachecraft" in by_name and "prefix" in by_name:
        ours, prefix = by_name["cachecraft"], by_name["prefix"]
        saved = 100 * (1 - ours.recomputed_tokens / max(prefix.recomputed_tokens, 1e-9))
        lines += [
            f"- **Cache-Craft** paper: {CACHECRAFT_NOTE}",
            f"  here: token-F1 agreement with full {ours.f1_agreement:.1f}% (our analogue of "
            f"ROUGE-L against the full-recompute answer) with "
            f"{100 - ours.reused_token_share:.1f}% of prompt tokens recomputed; {saved:.0f}% "
            f"fewer tokens computed than prefix; TTFT speed-up over prefix "
            f"{_speedup(prefix, ours)}; "
            f"variant hits {ours.tier_share['variant']:.0f}% of chunks.",
        ]
    if "a3" in by_name:
        ours = by_name["a3"]
        blend = by_name.get("cacheblend")
        blend_text = f", cacheblend {_share(blend.gold_f1, full.gold_f1)}" if blend else ""
        lines += [
            f"- **A3** paper: {A3_NOTE}",
            f"  here: gold F1 {_share(ours.gold_f1, full.gold_f1)} of full's{blend_text}; "
            f"F1 agreement with full {ours.f1_agreement:.1f}%; TTFT speed-up over full "
            f"{_speedup(full, ours)}.",
        ]
    return ["", "Next to the papers:", "", *lines] if lines else []


def _speedup(slow: PolicyFigures, fast: PolicyFigures) -> str:
    return f"{slow.ttft_mean_s / max(fast.ttft_mean_s, 1e-9):.2f}x"


def _normalized(value: float, zero: float, full: float) -> str:
    """FusionRAG's Normalized-F1: the share of the ratio-0 -> full gap a policy closes."""
    if full - zero <= 1e-9:
        return "n/a (ratio 0 already scores as full)"
    return f"{100 * (value - zero) / (full - zero):.0f}%"


def _share(value: float, full: float) -> str:
    return "n/a (full scores 0)" if full <= 0 else f"{100 * value / full:.0f}%"
