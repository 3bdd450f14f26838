"""``adarag calibrate --packet``: fit a packet's tokens (bridge, trailer) by self-distillation.

KV Packet's recipe with the chunk KV held fixed (no gradient through any document):

1. **Teacher.** For every calibration question, full recomputation of the prompt decodes its
   greedy answer; its next-token distributions over that answer (the prompt's last token, then
   each answer token in turn) are kept as their top :data:`TOP_K` probabilities and the mass
   left over. Each chunk's independent KV is computed once, as ingest stores it (rounded to the
   storage format).
2. **Student.** The reused path the packet will run on: a fused prefill of the prompt with the
   bridge opening the query and a trailer ending every chunk (computed after its chunk alone,
   as warming stores it), every chunk's KV reused at ``ratio`` with the pipeline's selection
   rule; then the bridge, the question and the teacher's answer run again over the context rows
   of that prefill with autograd (:func:`~adarag.engine.packet_student.tail_logits`), the
   trailers' rows in it carrying their gradient.
3. **Fit.** Adam on the packet's rows alone, one question a step, minimising the KL from the
   teacher's distributions to the student's. Each question's teacher record is a file under the
   records folder and every pass over the questions is checkpointed, so a stopped run resumes
   where it was. Every fifth question is held out and scored before and after.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load, save

from adarag.cache.codec import KVCodec
from adarag.config import RecomputeConfig
from adarag.engine.core import Engine
from adarag.engine.packet import packet_ids
from adarag.engine.packet_student import FreshRows, context_copy, tail_logits, tail_rows
from adarag.engine.prefill_request import LearnedControls, PrefillRequest
from adarag.errors import InputError
from adarag.evaluation.reuse import independent_chunks, reuse_sources
from adarag.evaluation.workload import BenchQuestion
from adarag.fitted import FittedModel
from adarag.kv import ChunkKV, safetensors_metadata
from adarag.pipeline import AdaRAG
from adarag.pipeline.learned import learned_controls
from adarag.profiles.packet import BRIDGE, TRAILER, PacketRecord, packet_file_name
from adarag.schema import GenerationParams, PromptLayout

logger = logging.getLogger(__name__)

TOP_K = 64
"""Teacher probabilities kept per answer position (the rest is one bucket)."""
HELD_OUT_EVERY = 5
"""Every fifth calibration question is held out of the fit and scores it."""
CHECKPOINT = "packet-checkpoint.safetensors"
INIT_TEXT = "\n"
"""The bridge starts as these tokens' embeddings (repeated to fill it)."""
TRAILER_TEXT = "\n\n"
"""The trailer starts as these tokens' embeddings (repeated to fill it)."""


@dataclass(frozen=True)
class PacketExample:
    """One calibration question as the fit reads it.

    Attributes:
        layout: The prompt without the bridge.
        system_kv: The system prefix's exact KV.
        chunk_kvs: Each chunk's independent KV, as the store serves it.
        answer_ids: Full recomputation's greedy answer.
        top_ids: [n_answer + 1, TOP_K] the teacher's most likely next tokens at each position.
        top_logprobs: [n_answer + 1, TOP_K] their log-probabilities.
    """

    layout: PromptLayout
    system_kv: ChunkKV
    chunk_kvs: tuple[ChunkKV, ...]
    answer_ids: tuple[int, ...]
    top_ids: torch.Tensor
    top_logprobs: torch.Tensor


@dataclass(frozen=True)
class PacketFit:
    """What a fit produced: the file's bytes and the profile's record of it."""

    data: bytes
    record: PacketRecord
    seconds: float


def teacher_example(
    rag: AdaRAG, item: BenchQuestion, params: GenerationParams, storage: KVCodec
) -> PacketExample:
    """Full recomputation's answer and distributions, and each chunk's stored independent KV."""
    engine = rag.engine
    layout = rag.layout(item.question, item.chunks, params)
    with torch.inference_mode():
        full = engine.prefill(PrefillRequest(layout, max_new_tokens=params.max_new_tokens))
        answer = tuple(engine.decode_tokens(layout, full, params))
        system_kv, chunks = independent_chunks(engine, layout)
    cut = layout.num_tokens  # decoding wrote the answer's rows after the prompt's only
    logits = [full.logits[None]]
    if answer:
        with torch.no_grad():
            context = context_copy(full.kv, cut)
            logits.append(tail_logits(engine.runner, context, cut, torch.tensor(answer)))
    log_probs = torch.log_softmax(torch.cat(logits).float(), dim=-1)
    top = log_probs.topk(TOP_K, dim=-1)
    stored = tuple(storage.decode(storage.encode(kv)) for kv in chunks)  # as the store serves it
    return PacketExample(layout, system_kv, stored, answer, top.indices, top.values)


def save_example(example: PacketExample, path: Path) -> None:
    """Write one question's teacher record as safetensors (whole, then renamed into place)."""
    layout = example.layout
    tensors = {
        "system_ids": torch.tensor(layout.system_ids, dtype=torch.int64),
        "query_ids": torch.tensor(layout.query_ids, dtype=torch.int64),
        "answer_ids": torch.tensor(example.answer_ids, dtype=torch.int64),
        "top_ids": example.top_ids,
        "top_logprobs": example.top_logprobs,
        "system_k": example.system_kv.k,
        "system_v": example.system_kv.v,
    }
    for idx, (ids, kv) in enumerate(zip(layout.chunk_ids, example.chunk_kvs, strict=True)):
        tensors[f"chunk{idx}_ids"] = torch.tensor(ids, dtype=torch.int64)
        tensors[f"chunk{idx}_k"], tensors[f"chunk{idx}_v"] = kv.k, kv.v
    starts = [example.system_kv.start_position] + [kv.start_position for kv in example.chunk_kvs]
    metadata = {"num_chunks": str(len(layout.chunk_ids)), "starts": json.dumps(starts)}
    partial = path.with_suffix(".partial")
    partial.write_bytes(save({k: v.contiguous() for k, v in tensors.items()}, metadata))
    partial.replace(path)


def load_example(path: Path) -> PacketExample:
    """Read :func:`save_example`'s file."""
    data = path.read_bytes()
    tensors, metadata = load(data), safetensors_metadata(data, len(data))
    starts = json.loads(metadata["starts"])
    chunks = range(int(metadata["num_chunks"]))
    layout = PromptLayout(
        _ids(tensors["system_ids"]),
        tuple(_ids(tensors[f"chunk{idx}_ids"]) for idx in chunks),
        _ids(tensors["query_ids"]),
    )
    return PacketExample(
        layout,
        ChunkKV(tensors["system_k"], tensors["system_v"], starts[0]),
        tuple(
            ChunkKV(tensors[f"chunk{idx}_k"], tensors[f"chunk{idx}_v"], starts[idx + 1])
            for idx in chunks
        ),
        _ids(tensors["answer_ids"]),
        tensors["top_ids"],
        tensors["top_logprobs"],
    )


def _ids(tensor: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(x) for x in tensor.tolist())


def distillation_loss(
    student_logits: torch.Tensor, top_ids: torch.Tensor, top_logprobs: torch.Tensor
) -> torch.Tensor:
    """KL(teacher || student) per position, mean, over the teacher's top-K and the rest bucket."""
    log_q = torch.log_softmax(student_logits.float(), dim=-1)
    top_q = log_q.gather(-1, top_ids)
    p = top_logprobs.exp()
    rest_p = (1.0 - p.sum(-1)).clamp(min=1e-8)
    rest_q = (1.0 - top_q.exp().sum(-1)).clamp(min=1e-8)
    kl = (p * (top_logprobs - top_q)).sum(-1) + rest_p * (rest_p.log() - rest_q.log())
    return kl.mean()


@dataclass(frozen=True)
class Student:
    """The reused path the packet is fitted for: the chunks' ratio and the selection rule."""

    ratio: float
    selection: RecomputeConfig
    token_scorer: FittedModel | None = None


@dataclass(frozen=True)
class PacketShape:
    """Rows of each part of a packet table: the bridge's first, then the trailer's.

    ``replaces``: the query suffix's opening ids the bridge stands in for (as many as its rows;
    its rows start as their embeddings); empty: the bridge is inserted before the query.
    """

    bridge: int
    trailer: int
    replaces: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        assert not self.replaces or len(self.replaces) == self.bridge, "one row per replaced id"

    def ids(self, vocab_size: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The bridge's and the trailer's packet ids."""
        ids = packet_ids(vocab_size, self.bridge + self.trailer)
        return ids[: self.bridge], ids[self.bridge :]


def student_loss(
    engine: Engine,
    example: PacketExample,
    table: torch.Tensor | None,
    shape: PacketShape,
    student: Student,
) -> torch.Tensor:
    """The KL of the reused path carrying the packet ``table`` (differentiable in it).

    None: the reused path as it is without a packet. A trailer's rows are computed after their
    chunk alone (as warming stores them) and reused with it; those the selection does not
    recompute keep their gradient.
    """
    bridge_ids, trailer_ids = shape.ids(engine.spec.vocab_size) if table is not None else ((), ())
    opening = example.layout.query_ids[: len(shape.replaces)]
    if opening != shape.replaces:
        raise InputError(
            f"a calibration prompt's query opens with {opening}, not the {shape.replaces} the "
            "bridge replaces; fit the packet with the prompt template the pipeline uses"
        )
    replaced = len(shape.replaces) if bridge_ids else 0
    layout = example.layout.with_trailers(trailer_ids).with_bridge(bridge_ids, replaced)
    chunks, trailers = list(example.chunk_kvs), []
    if trailer_ids:
        assert table is not None
        for idx, chunk in enumerate(chunks):
            rows = trailer_rows(engine, example.system_kv, chunk, trailer_ids, table)
            trailers.append(rows)
            chunks[idx] = ChunkKV(
                torch.cat([chunk.k.float(), rows.k.detach().float()], dim=1),
                torch.cat([chunk.v.float(), rows.v.detach().float()], dim=1),
                chunk.start_position,
            )
    sources = reuse_sources(example.system_kv, chunks, student.ratio)
    with torch.inference_mode():
        fused = engine.prefill(
            PrefillRequest(
                layout,
                sources,
                selection=student.selection,
                controls=LearnedControls(
                    token_scorer=student.token_scorer,
                    packet=None if table is None else table.detach(),
                ),
            ),
        )
    fresh = _moved_trailers(engine, layout, trailers, fused.recomputed_positions)
    cut = layout.cu_segments[-2]
    tail = torch.tensor((*layout.query_ids, *example.answer_ids))
    logits = tail_logits(engine.runner, context_copy(fused.kv, cut), cut, tail, table, fresh)
    answered = logits[len(layout.query_ids) - 1 :]
    return distillation_loss(answered, example.top_ids, example.top_logprobs)


def trailer_rows(
    engine: Engine,
    system_kv: ChunkKV,
    chunk: ChunkKV,
    trailer_ids: tuple[int, ...],
    table: torch.Tensor,
) -> FreshRows:
    """The trailer's K/V after ``chunk`` alone (after the system prefix), with autograd."""
    runner = engine.runner
    length = system_kv.num_tokens + chunk.num_tokens
    context = runner.new_cache(length)
    with torch.no_grad():
        context.load(0, system_kv.to(context.k.dtype), runner.inv_freq)
        context.load(system_kv.num_tokens, chunk.to(context.k.dtype), runner.inv_freq)
    context.length = length
    return tail_rows(runner, context, length, torch.tensor(trailer_ids), table)


def _moved_trailers(
    engine: Engine,
    layout: PromptLayout,
    trailers: Sequence[FreshRows],
    recomputed: torch.Tensor,
) -> FreshRows | None:
    """Each chunk's trailer rows at their place in ``layout``, but those recomputed there."""
    if not trailers:
        return None
    cu = layout.cu_segments
    parts = []
    for idx, rows in zip(layout.chunk_segment_idx, trailers, strict=True):
        end = cu[idx + 2]  # the chunk's segment (after the system prefix) ends at its trailer
        positions = torch.arange(end - rows.positions.numel(), end)
        moved = rows.moved(positions, engine.runner.inv_freq)
        keep = ~torch.isin(positions, recomputed)
        parts.append(FreshRows(positions[keep], moved.k[:, keep], moved.v[:, keep]))
    return FreshRows.joined(parts)


def initial_rows(engine: Engine, num_tokens: int, text: str = INIT_TEXT) -> torch.Tensor:
    """Starting rows of a packet part: the embeddings of ``text``'s tokens, repeated."""
    ids = engine.tokenizer.encode(text, add_special_tokens=False)  # type: ignore[attr-defined]
    return _embedded(engine, (ids * (num_tokens // max(len(ids), 1) + 1))[:num_tokens])


def _embedded(engine: Engine, ids: Sequence[int]) -> torch.Tensor:
    """The model's input embeddings of ``ids`` [len(ids), hidden_size] (float32, detached)."""
    with torch.no_grad():
        return engine.model.embed(torch.tensor(list(ids), dtype=torch.int64)).float().clone()


def fit_packet(
    rag: AdaRAG,
    questions: Sequence[tuple[str, BenchQuestion]],
    records: Path,
    params: GenerationParams,
    *,
    ratio: float,
    shape: PacketShape,
    epochs: int = 3,
    learning_rate: float = 0.05,
    seed: int = 0,
    progress: Callable[[str], None] = print,
    starts: tuple[str, str] = (INIT_TEXT, TRAILER_TEXT),
) -> PacketFit:
    """Fit the packet on ``questions`` (the held-out fifth scores it); resumes from ``records``.

    Args:
        rag: The pipeline of the model (its selection rule is the student's).
        questions: Calibration questions only (never the report split).
        records: Where the teacher records and the checkpoint of each pass are kept.
        params: Decoding of the teacher's answers.
        ratio: The reused chunks' recomputation ratio in the student.
        shape: Rows of the bridge and of the trailer.
        epochs: Passes over the fitting questions.
        learning_rate: Adam's step, relative to the starting rows' RMS.
        seed: Order of the questions in each pass.
        progress: Where each line of progress goes.
        starts: The texts whose token embeddings the bridge and the trailer start as.
    """
    started = time.perf_counter()
    engine = rag.engine
    selection = rag.config.selection
    scorer = learned_controls(rag.config.cache.recompute, rag.profile).token_scorer
    student = Student(ratio, selection, scorer)
    storage = KVCodec(rag.config.cache.store.storage_dtype)
    teachers = records / "teacher"
    teachers.mkdir(parents=True, exist_ok=True)
    paths = []
    for number, (dataset, item) in enumerate(questions, 1):
        path = teachers / f"{dataset}-{_safe(item.qid)}.safetensors"
        if not path.exists():  # kept between runs: a stopped fit resumes
            save_example(teacher_example(rag, item, params, storage), path)
        paths.append(path)
        if number % 10 == 0 or number == len(questions):
            progress(f"teacher: {number}/{len(questions)} questions ({dataset} {item.qid})")
    held = [p for i, p in enumerate(paths) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1]
    fitting = [p for i, p in enumerate(paths) if i % HELD_OUT_EVERY != HELD_OUT_EVERY - 1]
    bridge_start = (
        _embedded(engine, shape.replaces)
        if shape.replaces
        else initial_rows(engine, shape.bridge, starts[0])
    )
    initial = torch.cat([bridge_start, initial_rows(engine, shape.trailer, starts[1])])
    table = initial.clone().requires_grad_(True)
    scale = float(initial.pow(2).mean().sqrt())
    optimiser = torch.optim.Adam([table], lr=learning_rate * scale)
    checkpoint_path = records / CHECKPOINT
    curve: list[float] = []
    done_epochs = 0
    if checkpoint_path.exists():
        data = checkpoint_path.read_bytes()
        state, metadata = load(data), safetensors_metadata(data, len(data))
        if tuple(state["table"].shape) != tuple(table.shape):
            raise InputError(
                f"{checkpoint_path} holds a packet of another shape; pass another --records "
                "folder, or delete the checkpoint to start over"
            )
        with torch.no_grad():
            table.copy_(state["table"])
        optimiser.state[table] = {
            "step": state["step"],
            "exp_avg": state["exp_avg"],
            "exp_avg_sq": state["exp_avg_sq"],
        }
        curve, done_epochs = json.loads(metadata["curve"]), int(metadata["epochs"])
        progress(f"resumed after pass {done_epochs} (loss curve {_curve(curve)})")

    def mean_loss(items: Sequence[Path], rows: torch.Tensor | None) -> float:
        with torch.no_grad():
            return statistics.fmean(
                float(student_loss(engine, load_example(path), rows, shape, student))
                for path in items
            )

    if not curve:
        curve += [mean_loss(fitting, None), mean_loss(fitting, table.detach())]
        progress(f"no packet: mean KL {curve[0]:.4f}; its starting rows: {curve[1]:.4f}")
    for epoch in range(done_epochs + 1, epochs + 1):
        shuffled = list(fitting)
        random.Random(seed + epoch).shuffle(shuffled)  # the same order when resumed
        losses = []
        for step, path in enumerate(shuffled, 1):
            optimiser.zero_grad()
            loss = student_loss(engine, load_example(path), table, shape, student)
            loss.backward()
            torch.nn.utils.clip_grad_norm_([table], max_norm=1.0)
            optimiser.step()
            losses.append(float(loss.detach()))
            if step % 20 == 0 or step == len(shuffled):
                progress(
                    f"pass {epoch}/{epochs}: {step}/{len(shuffled)} questions, running KL "
                    f"{statistics.fmean(losses[-20:]):.4f}"
                )
        curve.append(statistics.fmean(losses))
        moments = optimiser.state[table]
        state = {name: moments[name] for name in ("step", "exp_avg", "exp_avg_sq")}
        state["table"] = table.detach()
        metadata = {"curve": json.dumps(curve), "epochs": str(epoch)}
        saved = save({name: tensor.contiguous() for name, tensor in state.items()}, metadata)
        partial = checkpoint_path.with_suffix(".partial")
        partial.write_bytes(saved)
        partial.replace(checkpoint_path)
    held_out = None
    if held:
        held_out = (mean_loss(held, None), mean_loss(held, table.detach()))
        before, after = held_out
        progress(f"held out ({len(held)} questions): mean KL {before:.4f} -> {after:.4f}")
    rows = table.detach().float()
    parts = {BRIDGE: rows[: shape.bridge], TRAILER: rows[shape.bridge :]}
    tensors = {name: part.contiguous() for name, part in parts.items() if part.shape[0]}
    data = save(tensors, {"format": "adarag-packet-1"})
    record = PacketRecord(
        file=packet_file_name(engine.checkpoint.name, data),
        digest=hashlib.sha256(data).hexdigest(),
        bridge_tokens=shape.bridge,
        ratio=ratio,
        num_questions=len(fitting),
        epochs=epochs,
        loss_curve=tuple(round(x, 5) for x in curve),
        held_out_kl=None if held_out is None else (round(held_out[0], 5), round(held_out[1], 5)),
        trailer_tokens=shape.trailer,
        bridge_replaces=shape.replaces,
    )
    (records / "packet-fit.json").write_text(json.dumps(record.to_dict(), indent=1) + "\n")
    return PacketFit(data, record, time.perf_counter() - started)


def _safe(name: str) -> str:
    """A question id as a file name."""
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name)[:80]


def _curve(curve: Sequence[float]) -> str:
    return " -> ".join(f"{x:.4f}" for x in curve)
