"""Oracle labels for the learned selector: what the output-aware oracle recomputes, per question.

For one calibration question, the prompt ``system + chunks + question`` is prefilled in full
(the reference answer) and fused from every chunk's independent KV. Two things are recorded for
every reused token (a *candidate*):

- its run-time features, exactly as the ``learned`` rule computes them in a fused prefill
  (:mod:`adarag.engine.token_features`);
- the output-aware oracle's verdict (:mod:`adarag.evaluation.output_oracle`): the first-order
  gain of making the token exact for full recomputation's answer, and the oracle's scores at
  each labelled ratio (its chosen set there is the top of the budget).

The fused prefill that yields the features runs ``learned`` without a scorer, that is
``query_deviation`` at the first labelled ratio above 0; its answer is recorded too, against
the reference. When the pipeline carries a bridge (``cache.recompute.packet`` and a profile with
one), the reused prefills and the oracle run with it, as the ``learned`` rule will at run time;
the reference is full recomputation without it.

Records are one safetensors file per question under ``<dir>/<dataset>/``, written atomically,
so a stopped run resumes and several runs can share the questions (sharding). Large tables stay
out of the repository; the fitted selector goes into the model's profile.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from adarag.config import RecomputeConfig
from adarag.engine.prefill_request import Collect, LearnedControls, PrefillRequest
from adarag.engine.selection import num_to_recompute
from adarag.engine.token_features import raw_columns
from adarag.errors import InputError
from adarag.evaluation.metrics import exact_match
from adarag.evaluation.output_oracle import AnswerLoss, oracle_ranking
from adarag.evaluation.reuse import independent_chunks, reuse_sources
from adarag.evaluation.workload import BenchQuestion
from adarag.pipeline import AdaRAG
from adarag.pipeline.answer_stream import answer_text
from adarag.schema import GenerationParams

logger = logging.getLogger(__name__)

LABEL_RATIOS = (0.1, 0.2, 0.3)


@dataclass(frozen=True)
class SelectorRecord:
    """One question's candidates: their run-time features and the oracle's labels.

    Attributes:
        dataset: The data set the question came from (the leave-one-out groups).
        qid: The question's id.
        columns: Names of ``features``' columns (:func:`~adarag.engine.token_features.raw_columns`).
        features: [n, len(columns)] float32 raw features of the candidates, in position order.
        positions: [n] the candidates' positions.
        token_ids: [n] their token ids.
        gain: [n] the oracle's first-order gain of making each candidate exact (no token made
            exact yet): the reduction of the reference answer's loss, to first order.
        oracle_scores: Per labelled ratio, [n] the oracle's scores (its greedy rounds' order;
            the top ``budget(ratio)`` are its chosen set).
        budgets: Per labelled ratio, the number of candidates a fused prefill recomputes.
        reference: Full recomputation's answer.
        baseline_answer: The answer at the first labelled ratio under ``query_deviation``.
    """

    dataset: str
    qid: str
    columns: tuple[str, ...]
    features: torch.Tensor
    positions: torch.Tensor
    token_ids: torch.Tensor
    gain: torch.Tensor
    oracle_scores: dict[float, torch.Tensor]
    budgets: dict[float, int]
    reference: str
    baseline_answer: str

    def chosen(self, ratio: float) -> torch.Tensor:
        """[n] bool: the candidates the oracle recomputes at ``ratio``."""
        scores = self.oracle_scores[ratio]
        order = torch.sort(-scores, stable=True).indices[: self.budgets[ratio]]
        mask = torch.zeros(scores.numel(), dtype=torch.bool)
        mask[order] = True
        return mask

    @property
    def baseline_agrees(self) -> bool:
        """Whether the baseline answer equals the reference (normalised)."""
        return bool(exact_match(self.baseline_answer, self.reference))


def labelling_bridge(rag: AdaRAG) -> LearnedControls:
    """The bridge of ``rag``'s packet, the one part of a packet labels carry; empty if none."""
    learned = rag.learned_controls
    if not learned.bridge_tokens:
        return LearnedControls()
    return replace(learned, token_scorer=None, ladder=None, trailer_tokens=0)


def packet_folder(directory: Path, rag: AdaRAG) -> Path:
    """Where ``rag``'s labels and chains live: ``directory``, or its packet's folder in it.

    A packet's folder is ``packet-<digest>``, so records taken with another packet (or none)
    never mix.
    """
    digest = rag.learned_controls.packet_digest
    return directory / f"packet-{digest[:12]}" if digest else directory


def label_question(
    rag: AdaRAG,
    dataset: str,
    item: BenchQuestion,
    params: GenerationParams,
    ratios: Sequence[float] = LABEL_RATIOS,
    bridge: LearnedControls | None = None,
) -> SelectorRecord:
    """Features and oracle labels of one question's reused tokens (``bridge`` in its query)."""
    engine = rag.engine
    bridge = bridge or LearnedControls()
    layout = rag.layout(item.question, item.chunks, params)
    full = engine.prefill(PrefillRequest(layout, max_new_tokens=params.max_new_tokens))
    reference_ids = list(engine.decode_tokens(layout, full, params))
    reference = answer_text(reference_ids, engine.tokenizer, params)
    system_kv, chunk_kvs = independent_chunks(engine, layout)
    first = min(ratio for ratio in ratios if ratio > 0.0)
    sources = reuse_sources(system_kv, chunk_kvs, first)
    layout = bridge.bridged(layout, sources, engine.spec.vocab_size)
    fused = engine.prefill(
        PrefillRequest(
            layout,
            sources,
            max_new_tokens=params.max_new_tokens,
            selection=RecomputeConfig(selection_policy="learned"),
            collect=Collect(features=True),
            controls=bridge,
        ),
    )
    assert fused.candidate_features is not None, "the learned rule collects features"
    baseline = answer_text(engine.decode_tokens(layout, fused, params), engine.tokenizer, params)
    reused = engine.prefill(
        PrefillRequest(layout, reuse_sources(system_kv, chunk_kvs, 0.0), controls=bridge)
    )
    cu = layout.cu_segments
    positions = torch.arange(cu[1], cu[-2])
    assert positions.numel() == fused.candidate_features.shape[0], "every chunk token competes"
    answer_ids = reference_ids or [int(full.logits.argmax())]
    with torch.inference_mode(False), torch.enable_grad():
        loss_of = AnswerLoss(engine, layout, reused.kv, full.kv, answer_ids, bridge.packet)
        gain = loss_of.gain(torch.zeros(cu[-2]))
        oracle = {
            ratio: oracle_ranking(loss_of, layout, ratio, first_gain=gain)[positions]
            for ratio in ratios
        }
    return SelectorRecord(
        dataset=dataset,
        qid=item.qid,
        columns=raw_columns(engine.spec.num_layers),
        features=fused.candidate_features.float(),
        positions=positions,
        token_ids=torch.tensor(layout.token_ids)[positions],
        gain=gain[positions].float(),
        oracle_scores=oracle,
        budgets={
            ratio: sum(num_to_recompute(len(ids), ratio) for ids in layout.chunk_ids)
            for ratio in ratios
        },
        reference=reference,
        baseline_answer=baseline,
    )


# --- storage


def record_path(directory: Path, dataset: str, qid: str) -> Path:
    """Where one question's record lives."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", qid)
    return directory / dataset / f"{safe}.safetensors"


def save_record(directory: Path, record: SelectorRecord) -> Path:
    """Write ``record`` atomically (a temporary file renamed into place)."""
    path = record_path(directory, record.dataset, record.qid)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {
        "features": record.features.contiguous(),
        "positions": record.positions.contiguous(),
        "token_ids": record.token_ids.contiguous(),
        "gain": record.gain.contiguous(),
        **{
            f"oracle@{ratio:g}": scores.float().contiguous()
            for ratio, scores in record.oracle_scores.items()
        },
    }
    meta = {
        "dataset": record.dataset,
        "qid": record.qid,
        "columns": list(record.columns),
        "budgets": {f"{ratio:g}": budget for ratio, budget in record.budgets.items()},
        "reference": record.reference,
        "baseline_answer": record.baseline_answer,
    }
    staging = path.with_suffix(f".{os.getpid()}.tmp")
    save_file(tensors, str(staging), metadata={"record": json.dumps(meta)})
    os.replace(staging, path)
    return path


def load_record(path: Path) -> SelectorRecord:
    """Read a record :func:`save_record` wrote.

    Raises:
        InputError: The file is not such a record.
    """
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as handle:
            meta = json.loads((handle.metadata() or {})["record"])
        tensors = load_file(str(path))
        budgets = {float(ratio): int(count) for ratio, count in meta["budgets"].items()}
        return SelectorRecord(
            dataset=meta["dataset"],
            qid=meta["qid"],
            columns=tuple(meta["columns"]),
            features=tensors["features"],
            positions=tensors["positions"],
            token_ids=tensors["token_ids"],
            gain=tensors["gain"],
            oracle_scores={ratio: tensors[f"oracle@{ratio:g}"] for ratio in budgets},
            budgets=budgets,
            reference=meta["reference"],
            baseline_answer=meta["baseline_answer"],
        )
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise InputError(
            f"{path}: not a selector label record ({type(err).__name__}: {err}); delete it to "
            "measure the question again"
        ) from err


def load_records(directory: Path, datasets: Iterable[str] | None = None) -> list[SelectorRecord]:
    """Every record under ``directory`` (of ``datasets`` when given), in a stable order."""
    wanted = None if datasets is None else set(datasets)
    return [
        load_record(path)
        for path in sorted(directory.glob("*/*.safetensors"))
        if wanted is None or path.parent.name in wanted
    ]


def record_labels(
    rag: AdaRAG,
    questions: Sequence[tuple[str, BenchQuestion]],
    directory: Path,
    params: GenerationParams,
    shard: tuple[int, int] = (0, 1),
    ratios: Sequence[float] = LABEL_RATIOS,
) -> int:
    """Label every ``(dataset, question)`` of this shard not recorded yet; returns how many.

    The labels carry ``rag``'s bridge (:func:`labelling_bridge`).

    Args:
        rag: The pipeline (its model and prompt layout).
        questions: The calibration questions with their data sets.
        directory: Where the records live (one file per question).
        params: Decoding options of the reference and baseline answers.
        shard: ``(i, n)``: every n-th question from the i-th, so n runs share the questions.
        ratios: The ratios whose oracle sets are labelled.
    """
    index, count = shard
    bridge = labelling_bridge(rag)
    done = 0
    for number, (dataset, item) in enumerate(questions):
        if number % count != index or record_path(directory, dataset, item.qid).exists():
            continue
        started = time.perf_counter()
        save_record(directory, label_question(rag, dataset, item, params, ratios, bridge))
        done += 1
        logger.info(
            "labelled %s %s (%d/%d) in %.1f s",
            dataset,
            item.qid,
            number + 1,
            len(questions),
            time.perf_counter() - started,
        )
    return done
