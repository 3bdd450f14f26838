"""PNG figures (matplotlib, imported lazily): attention heatmaps and benchmark plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from adarag.augment.calibrate import CalibrationFit, OperatingPoint
from adarag.cache.profile import ModelProfile
from adarag.errors import MissingDependencyError


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
    directory.mkdir(parents=True, exist_ok=True)
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
        path = directory / f"attention_layers_{band.start + 1:02d}-{band.end:02d}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
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
    path = directory / "attention_shares.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [*paths, path]


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
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
