"""PNG figures (matplotlib, imported lazily): attention heatmaps and benchmark plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
    layers = range(1, profile.num_layers + 1)
    axis.plot(layers, profile.predecessor_share, label="share on predecessor chunk")
    axis.plot(layers, profile.sink_share, label="share on the strongest other earlier chunk")
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
