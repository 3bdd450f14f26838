"""PNG figures (matplotlib, imported lazily): attention heatmaps, calibration and benchmarks."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from adarag.augment.agreement import AgreementModel, StepEvidence
from adarag.augment.calibrate import CalibrationFit, OperatingPoint
from adarag.errors import MissingDependencyError
from adarag.evaluation.harness import QueryRecord
from adarag.evaluation.report import PolicySummary
from adarag.profiles import ModelProfile


def pyplot() -> Any:
    """Matplotlib's pyplot with a file-only backend."""
    try:
        import matplotlib
    except ImportError as err:
        raise MissingDependencyError("matplotlib", "plots") from err
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_profile(profile: ModelProfile, directory: Path) -> list[Path]:
    """One chunk-attention heatmap per layer band, and the per-layer shares; returns the paths."""
    plt = pyplot()
    num_chunks = profile.num_chunks
    labels = ["sys", *(f"c{i + 1}" for i in range(num_chunks)), "query"]
    paths = []
    for band in profile.bands:
        layers = profile.chunk_attention[band.start : band.end]
        mean = [
            [sum(layer[row][col] for layer in layers) / len(layers) for col in range(len(labels))]
            for row in range(len(labels))
        ]
        fig, axis = plt.subplots(figsize=(5, 4.5))
        image = axis.imshow(mean, cmap="viridis", vmin=0.0)
        axis.set_xticks(range(len(labels)), labels)
        axis.set_yticks(range(len(labels)), labels)
        axis.set_xlabel("attended segment (key)")
        axis.set_ylabel("attending segment (query)")
        axis.set_title(f"{profile.model}: layers {band.start + 1}-{band.end} ({band.pattern})")
        fig.colorbar(image, ax=axis, fraction=0.046)
        fig.tight_layout()
        name = f"attention_layers_{band.start + 1:02d}-{band.end:02d}.png"
        paths.append(_save(fig, plt, directory / name))
    fig, axis = plt.subplots(figsize=(7, 3.5))
    layer_numbers = range(1, profile.num_layers + 1)
    axis.plot(layer_numbers, profile.predecessor_share, label="share on predecessor chunk")
    axis.plot(layer_numbers, profile.sink_share, label="share on the strongest other earlier chunk")
    for band in profile.bands[1:]:
        axis.axvline(band.start + 0.5, color="grey", linestyle=":")
    axis.set_xlabel("layer")
    axis.set_ylabel("share of cross-chunk attention")
    axis.legend()
    fig.tight_layout()
    return [*paths, _save(fig, plt, directory / "attention_shares.png")]


def plot_tradeoff(result: CalibrationFit, path: Path) -> Path:
    """Quality against cost over τ, one line per λ, the chosen setting marked."""
    plt = pyplot()
    fig, axis = plt.subplots(figsize=(6.5, 4.5))
    by_weight: dict[float, list[OperatingPoint]] = {}
    for point in result.points:
        by_weight.setdefault(point.kl_weight, []).append(point)
    for weight, points in sorted(by_weight.items()):
        points = sorted(points, key=lambda p: p.cost)
        is_chosen = weight == result.chosen.kl_weight
        axis.plot(
            [p.cost for p in points],
            [p.quality for p in points],
            alpha=1.0 if is_chosen else 0.25,
            linewidth=2 if is_chosen else 1,
            label=f"λ = {weight:.1f}" if is_chosen or weight in (0.0, 1.0) else None,
        )
    chosen = result.chosen
    axis.scatter(
        [chosen.cost],
        [chosen.quality],
        color="red",
        zorder=5,
        label=f"chosen τ = {chosen.threshold:.2f}, λ = {chosen.kl_weight:.1f}",
    )
    axis.set_xlabel("cost: tokens processed / static top-k prompt tokens")
    axis.set_ylabel("quality: F1 with the full-recomputation answer")
    axis.set_title("Adaptive augmentation trade-off (calibration split)")
    axis.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, plt, path)


def plot_reliability(
    questions: Sequence[Sequence[StepEvidence]], model: AgreementModel, path: Path, bins: int = 8
) -> Path:
    """Reliability of the agreement model: predicted P(agreement) against the observed share."""
    plt = pyplot()
    steps = [step for question in questions for step in question]
    predicted = [model(step.confidence, step.margin) for step in steps]
    groups: dict[int, list[int]] = {}
    for index, value in enumerate(predicted):
        groups.setdefault(min(int(value * bins), bins - 1), []).append(index)
    fig, axis = plt.subplots(figsize=(5.0, 4.5))
    axis.plot([0, 1], [0, 1], ":", color="grey", label="perfect calibration")
    points = sorted(
        (
            sum(predicted[i] for i in members) / len(members),
            sum(steps[i].agrees for i in members) / len(members),
            len(members),
        )
        for members in groups.values()
    )
    axis.plot([p[0] for p in points], [p[1] for p in points], marker="o", label="steps")
    for x, y, n in points:
        axis.annotate(str(n), (x, y), fontsize=7, xytext=(3, -9), textcoords="offset points")
    axis.set_xlabel("predicted P(answer = static top-k answer)")
    axis.set_ylabel("observed share")
    axis.set_title("Agreement model reliability (calibration split)")
    axis.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, plt, path)


def ttft_vs_quality(summaries: Sequence[PolicySummary], title: str, path: Path) -> Path:
    """AdaCache Figure 5: mean TTFT against gold F1 and agreement F1, one point per policy."""
    points = [(s.policy, s.ttft.mean) for s in summaries]
    panels: list[tuple[str, Sequence[float | None]]] = [
        ("F1 against gold answers", [s.f1 for s in summaries]),
        ("F1 against the full-recomputation answer", [s.agreement_f1 for s in summaries]),
    ]
    return ttft_scatter(points, panels, title, path)


MARKERS = "osD^vP*Xph<>"


def ttft_scatter(
    points: Sequence[tuple[str, float]],
    panels: Sequence[tuple[str, Sequence[float | None]]],
    title: str,
    path: Path,
) -> Path:
    """One panel per ``(label, values)``: each policy's mean TTFT against its value.

    Policies are told apart by colour and marker, named in one legend below the panels (labels
    next to the points overprint where policies score alike). A None value is skipped; a panel
    with no value at all is left out.

    Args:
        points: Each policy's name and mean TTFT (s).
        panels: A y-axis label and one value per point.
        title: The figure's title.
        path: The PNG written (its folder is made).
    """
    plt = pyplot()
    shown = [(label, values) for label, values in panels if any(v is not None for v in values)]
    fig, axes = plt.subplots(1, max(len(shown), 1), figsize=(5.5 * max(len(shown), 1), 4.6))
    axes = list(axes) if len(shown) > 1 else [axes]
    colours = plt.get_cmap("tab20").colors
    for axis, (label, values) in zip(axes, shown, strict=False):
        for idx, ((policy, ttft), y) in enumerate(zip(points, values, strict=True)):
            if y is None:
                continue
            style = {"color": colours[idx % len(colours)], "marker": MARKERS[idx % len(MARKERS)]}
            axis.scatter(ttft, y, s=48, alpha=0.85, label=policy, **style)
        axis.set_xlabel("mean TTFT (s)")
        axis.set_ylabel(label)
        axis.set_xlim(left=0)
        axis.grid(alpha=0.3)
    legend: dict[str, Any] = {}  # one entry per policy, from whichever panel shows it
    for axis in axes:
        for handle, policy in zip(*axis.get_legend_handles_labels(), strict=True):
            legend.setdefault(policy, handle)
    handles, labels = list(legend.values()), list(legend)
    num_columns = min(len(labels), 6) or 1
    fig.legend(handles, labels, loc="lower center", ncol=num_columns, fontsize=8, frameon=False)
    fig.suptitle(title)
    num_rows = -(-len(labels) // num_columns)
    fig.tight_layout(rect=(0, 0.06 * num_rows, 1, 1))
    return _save(fig, plt, path)


def depth_histogram(
    records: Sequence[QueryRecord],
    policies: Sequence[str],
    top_k: int,
    title: str,
    path: Path,
) -> Path:
    """AdaCache Figure 7: how many chunks adaptive augmentation used, per augmenting policy."""
    plt = pyplot()
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
