"""The depth probe's records and fit: every augmentation step of a question, and its label.

A record (:func:`record_depth`) holds, for every step k = 1..K of one question (step k's answer
is static top-k's, each step reusing the earlier ones exactly), what the ``probe`` stop rule
reads there (:func:`adarag.augment.probe.probe_values`: the residual stream at the record's
layers, the lens signals, the margin, the retrieval scores) and the answer's gold F1. Records
are one safetensors file per question (the residual streams in float16), so runs resume.

The label of step k is whether no later step answers better (gold F1 at k at least every later
step's): a probe that stops at its first confident step then stops where the answer is already
as good as it will get. :func:`fit_probe` fits a regularised logistic model on the questions
whose gold F1 depends on the depth (:func:`is_informative`); the threshold is
chosen by replaying the rule against fixed top-k at equal prompt tokens (see
``benchmarks/depth.py report`` and :mod:`adarag.evaluation.depth`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from adarag.augment.probe import SIGNALS, hidden_names, probe_values
from adarag.config import AdaRagConfig
from adarag.errors import InputError
from adarag.evaluation.metrics import best_f1
from adarag.evaluation.profiling.fitting import fit_logistic
from adarag.fitted import FittedModel
from adarag.pipeline import AdaRAG
from adarag.schema import Chunk, GenerationParams, StepTrace

RECORDING_STORE_BYTES = 1024**3
"""The memory tier of a recording pipeline: one question's steps need far less; no disk tier."""


def exact_steps(
    config: AdaRagConfig, storage_dtype: str = "float32", **levers: object
) -> AdaRagConfig:
    """``config`` with the hard tier only, its store in memory: what records are measured with.

    Augmentation step k then finds chunks 1..k-1 as the previous step computed them and computes
    chunk k and the question; with a float32 store its answer is static top-k's, which the
    records' labels assume. ``levers`` set ``experimental.augment`` (e.g. ``reuse_step_kv``).
    """
    return AdaRagConfig.build(
        config,
        experimental={"augment": levers},
        cache={
            "soft": {"enabled": False},
            "independent": {"enabled": False},
            "store": {
                "storage_dtype": storage_dtype,
                "admission": "always",
                "memory_capacity_bytes": RECORDING_STORE_BYTES,
                "disk_capacity_bytes": 0,
            },
        },
    )


def probe_layers(num_layers: int) -> tuple[int, ...]:
    """The layers a record keeps: the middle one, three quarters up, and the last."""
    return tuple(sorted({num_layers // 2, (3 * num_layers) // 4, num_layers - 1}))


@dataclass(frozen=True)
class DepthRecord:
    """Every step of one question: the probe's features, the answers and their gold F1.

    Attributes:
        dataset: The data set (the leave-one-out groups).
        qid: The question's id.
        layers: The layers of ``hidden``'s blocks.
        hidden: [K, len(layers) * hidden_size] the last prompt token's residual stream per step.
        signals: [K, len(SIGNALS)] the probe's other features per step.
        f1: [K] gold F1 of each step's answer.
        answers: Each step's answer.
        prompt_tokens: Each step's prompt length.
    """

    dataset: str
    qid: str
    layers: tuple[int, ...]
    hidden: torch.Tensor
    signals: np.ndarray
    f1: np.ndarray
    answers: tuple[str, ...]
    prompt_tokens: tuple[int, ...]

    def labels(self) -> np.ndarray:
        """[K] 1.0 where no later step answers better (gold F1)."""
        best_after = np.maximum.accumulate(self.f1[::-1])[::-1]
        return (self.f1 >= best_after - 1e-9).astype(np.float64)

    def rows(self, features: Sequence[str]) -> np.ndarray:
        """[K, len(features)] the named features of every step."""
        width = self.hidden.shape[1]
        columns = dict(zip(hidden_names(width), self.hidden.float().numpy().T, strict=True))
        columns.update(zip(SIGNALS, self.signals.T, strict=True))
        return np.stack([columns[name] for name in features], axis=1)


def record_depth(
    rag: AdaRAG,
    dataset: str,
    qid: str,
    question: str,
    chunks: Sequence[Chunk],
    gold: Sequence[str],
    params: GenerationParams,
    layers: Sequence[int],
) -> tuple[DepthRecord, list[tuple[StepTrace, str]]]:
    """Run every step of ``question`` over ``chunks`` (best first); the record and each step."""
    layout = rag.layout(question, chunks, params)
    scores = [chunk.score for chunk in chunks]
    steps = rag.augmentation.each_step(layout, params, scores, layers)
    hidden, signals, f1, answers, tokens = [], [], [], [], []
    for depth, (_, answer, result) in enumerate(steps, 1):
        values = probe_values(result, depth)
        hidden.append(torch.tensor(result.hidden or ()))
        signals.append([values[name] for name in SIGNALS])
        f1.append(best_f1(answer, gold))
        answers.append(answer)
        tokens.append(layout.with_chunks(depth).num_tokens)
    record = DepthRecord(
        dataset,
        qid,
        tuple(layers),
        torch.stack(hidden).to(torch.float16),
        np.array(signals, dtype=np.float64),
        np.array(f1, dtype=np.float64),
        tuple(answers),
        tuple(tokens),
    )
    return record, [(trace, answer) for trace, answer, _ in steps]


def _path(directory: Path, dataset: str, qid: str) -> Path:
    return directory / dataset / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', qid)}.safetensors"


def has_depth_record(directory: Path, dataset: str, qid: str) -> bool:
    """Whether the question is recorded already."""
    return _path(directory, dataset, qid).exists()


def save_depth_record(directory: Path, record: DepthRecord) -> None:
    """Write ``record`` atomically."""
    path = _path(directory, record.dataset, record.qid)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "dataset": record.dataset,
        "qid": record.qid,
        "layers": list(record.layers),
        "signals": record.signals.tolist(),
        "f1": record.f1.tolist(),
        "answers": list(record.answers),
        "prompt_tokens": list(record.prompt_tokens),
    }
    staging = path.with_suffix(f".{os.getpid()}.tmp")
    save_file(
        {"hidden": record.hidden.contiguous()}, str(staging), metadata={"record": json.dumps(meta)}
    )
    os.replace(staging, path)


def load_depth_records(directory: Path, datasets: Sequence[str] | None = None) -> list[DepthRecord]:
    """Every record under ``directory`` (of ``datasets`` when given), in a stable order.

    Raises:
        InputError: A file is not such a record.
    """
    records = []
    for path in sorted(directory.glob("*/*.safetensors")):
        if datasets is not None and path.parent.name not in datasets:
            continue
        try:
            with safe_open(str(path), framework="pt") as handle:
                meta = json.loads((handle.metadata() or {})["record"])
                hidden = handle.get_tensor("hidden")
        except (OSError, ValueError, KeyError) as err:
            raise InputError(
                f"{path}: not a depth record ({type(err).__name__}: {err}); delete it to "
                "measure the question again"
            ) from err
        records.append(
            DepthRecord(
                meta["dataset"],
                meta["qid"],
                tuple(meta["layers"]),
                hidden,
                np.array(meta["signals"], dtype=np.float64),
                np.array(meta["f1"], dtype=np.float64),
                tuple(meta["answers"]),
                tuple(meta["prompt_tokens"]),
            )
        )
    return records


def probe_features(width: int, family: str = "all") -> tuple[str, ...]:
    """The probe's features: ``"hidden"``, ``"signals"`` or ``"all"`` of a record's width."""
    families = {
        "hidden": hidden_names(width),
        "signals": SIGNALS,
        "all": hidden_names(width) + SIGNALS,
    }
    if family not in families:
        raise ValueError(f"unknown probe feature family {family!r}; choose from {list(families)}")
    return families[family]


def is_informative(record: DepthRecord) -> bool:
    """Whether depth changes the question's gold F1 (else every depth answers as well)."""
    return bool(record.f1.max() > record.f1.min())


def fit_probe(
    records: Sequence[DepthRecord], features: Sequence[str], l2: float = 0.05
) -> FittedModel:
    """A logistic probe of "no later step answers better", each question weighing the same.

    It learns from the questions whose gold F1 depends on the depth: a question answered alike
    at every depth labels every step positive and says nothing about where to stop (without
    any informative question, it learns from them all).
    """
    records = [record for record in records if is_informative(record)] or list(records)
    x = np.concatenate([record.rows(features) for record in records])
    y = np.concatenate([record.labels() for record in records])
    weights = np.concatenate([np.full(len(r.f1), 1.0 / len(r.f1)) for r in records])
    return fit_logistic(x, y, features, weights, l2=l2)


def step_probabilities(model: FittedModel, record: DepthRecord) -> np.ndarray:
    """[K] the probe's probability at every step of ``record``."""
    return model.probabilities(record.rows(model.features))


def first_confident(probabilities: np.ndarray, threshold: float, floor: int = 1) -> int:
    """The depth the probe rule stops at: the first at or past ``floor`` reaching ``threshold``."""
    for depth in range(floor, len(probabilities) + 1):
        if probabilities[depth - 1] >= threshold:
            return depth
    return len(probabilities)
