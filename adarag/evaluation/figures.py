"""Benchmark figures: TTFT vs F1 per policy, chosen-depth histogram, TTFT vs top-k."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

from adarag.evaluation.harness import QueryRecord
from adarag.evaluation.report import PolicySummary
from adarag.plots import pyplot


def ttft_vs_quality(summaries: Sequence[PolicySummary], title: str, path: Path) -> Path:
    """AdaCache Figure 5: mean TTFT against gold F1 and agreement F1, one point per policy."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    panels = [("F1 against gold answers", lambda s: s.f1)]
    panels.append(("F1 against the full-recomputation answer", lambda s: s.agreement_f1))
    for axis, (label, value) in zip(axes, panels, strict=True):
        for summary in summaries:
            y = value(summary)
            if y is None:
                continue
            axis.scatter(summary.ttft.mean, y, s=40)
            axis.annotate(
                summary.policy,
                (summary.ttft.mean, y),
                fontsize=8,
                xytext=(4, 4),
                textcoords="offset points",
            )
        axis.set_xlabel("mean TTFT (s)")
        axis.set_ylabel(label)
        axis.set_xlim(left=0)
    fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, plt, path)


def depth_histogram(records: Sequence[QueryRecord], top_k: int, title: str, path: Path) -> Path:
    """AdaCache Figure 7: how many chunks adaptive augmentation used, per augmenting policy."""
    plt = pyplot()
    policies = [
        p for p in dict.fromkeys(r.policy for r in records) if "aca" in p or p == "adacache"
    ]
    fig, axis = plt.subplots(figsize=(6.5, 4))
    width = 0.8 / max(len(policies), 1)
    for idx, policy in enumerate(policies):
        counts = Counter(r.num_chunks_used for r in records if r.policy == policy)
        total = sum(counts.values())
        xs = [depth + (idx - (len(policies) - 1) / 2) * width for depth in range(1, top_k + 1)]
        axis.bar(xs, [counts.get(d, 0) / total for d in range(1, top_k + 1)], width, label=policy)
    axis.set_xticks(range(1, top_k + 1))
    axis.set_xlabel("chunks in the prompt when augmentation stopped")
    axis.set_ylabel("share of queries")
    axis.set_title(title)
    axis.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, plt, path)


def ttft_vs_top_k(by_top_k: Mapping[int, Sequence[PolicySummary]], title: str, path: Path) -> Path:
    """AdaCache Figure 8: mean TTFT per policy as top-k grows."""
    plt = pyplot()
    fig, axis = plt.subplots(figsize=(6.5, 4))
    ks = sorted(by_top_k)
    policies = list(dict.fromkeys(s.policy for k in ks for s in by_top_k[k]))
    for policy in policies:
        points = [(k, s.ttft.mean) for k in ks for s in by_top_k[k] if s.policy == policy]
        axis.plot([k for k, _ in points], [t for _, t in points], marker="o", label=policy)
    axis.set_xticks(ks)
    axis.set_xlabel("top-k (for augmentation: the most chunks it may add)")
    axis.set_ylabel("mean TTFT (s)")
    axis.set_title(title)
    axis.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, plt, path)


def _save(fig: object, plt: object, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)  # type: ignore[attr-defined]
    plt.close(fig)  # type: ignore[attr-defined]
    return path
