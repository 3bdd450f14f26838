"""``adarag calibrate --packet``: fit the bridge's packet tokens by KL self-distillation.

KV Packet's recipe with the chunk KV held fixed (no gradient through any document):

1. **Teacher.** For every calibration question, full recomputation of the prompt decodes its
   greedy answer; its next-token distributions over that answer (the prompt's last token, then
   each answer token in turn) are kept as their top :data:`TOP_K` probabilities and the mass
   left over. Each chunk's independent KV is computed once, as ingest stores it (rounded to the
   storage format).
2. **Student.** The reused path the packet will run on: a fused prefill of the prompt with the
   bridge opening the query, every chunk's KV reused at ``ratio`` with the pipeline's selection
   rule, then the bridge, the question and the teacher's answer run again over the context rows
   of that prefill with autograd (:func:`~adarag.engine.packet_student.tail_logits`).
3. **Fit.** Adam on the bridge's rows alone, one question a step, minimising the KL from the
   teacher's distributions to the student's; every pass over the questions is checkpointed, so
   a stopped run resumes. Every fifth question is held out and scored before and after.
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
from safetensors.torch import save

from adarag.cache.codec import KVCodec
from adarag.config import RecomputeConfig
from adarag.engine.core import Engine
from adarag.engine.packet import packet_ids
from adarag.engine.packet_student import context_copy, tail_logits
from adarag.engine.prefill_request import LearnedControls, PrefillRequest
from adarag.evaluation.reuse import independent_chunks, reuse_sources
from adarag.evaluation.workload import BenchQuestion
from adarag.fitted import FittedModel
from adarag.kv import ChunkKV
from adarag.pipeline import AdaRAG
from adarag.pipeline.learned import learned_controls
from adarag.profiles.packet import BRIDGE, PacketRecord, packet_file_name
from adarag.schema import GenerationParams, PromptLayout

logger = logging.getLogger(__name__)

TOP_K = 64
"""Teacher probabilities kept per answer position (the rest is one bucket)."""
HELD_OUT_EVERY = 5
"""Every fifth calibration question is held out of the fit and scores it."""
CHECKPOINT = "packet-checkpoint.pt"
INIT_TEXT = "\n\nUse the passages above to answer the question below.\n"
"""The bridge starts as these tokens' embeddings (repeated to fill it)."""


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
    stored = tuple(storage.decode(storage.encode(kv)).to(kv.k.dtype) for kv in chunks)
    return PacketExample(layout, system_kv, stored, answer, top.indices, top.values)


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


def student_loss(
    engine: Engine, example: PacketExample, bridge: torch.Tensor | None, student: Student
) -> torch.Tensor:
    """The KL of the reused path carrying ``bridge`` (differentiable with respect to it).

    None: the reused path as it is without a packet.
    """
    ids = () if bridge is None else packet_ids(engine.spec.vocab_size, bridge.shape[0])
    layout = example.layout.with_bridge(ids)
    sources = reuse_sources(example.system_kv, list(example.chunk_kvs), student.ratio)
    with torch.inference_mode():
        fused = engine.prefill(
            PrefillRequest(
                layout,
                sources,
                selection=student.selection,
                controls=LearnedControls(
                    token_scorer=student.token_scorer,
                    bridge=None if bridge is None else bridge.detach(),
                ),
            ),
        )
    cut = layout.cu_segments[-2]
    tail = torch.tensor((*layout.query_ids, *example.answer_ids))
    logits = tail_logits(engine.runner, context_copy(fused.kv, cut), cut, tail, bridge)
    answered = logits[len(layout.query_ids) - 1 :]
    return distillation_loss(answered, example.top_ids, example.top_logprobs)


def initial_bridge(engine: Engine, num_tokens: int) -> torch.Tensor:
    """The bridge's starting rows: the embeddings of :data:`INIT_TEXT`'s tokens, repeated."""
    ids = engine.tokenizer.encode(INIT_TEXT, add_special_tokens=False)  # type: ignore[attr-defined]
    ids = (ids * (num_tokens // max(len(ids), 1) + 1))[:num_tokens]
    with torch.no_grad():
        return engine.model.embed(torch.tensor(ids)).float().clone()


def fit_bridge(
    rag: AdaRAG,
    questions: Sequence[tuple[str, BenchQuestion]],
    records: Path,
    params: GenerationParams,
    *,
    ratio: float,
    num_tokens: int = 8,
    epochs: int = 3,
    learning_rate: float = 0.05,
    seed: int = 0,
    progress: Callable[[str], None] = print,
) -> PacketFit:
    """Fit the bridge on ``questions`` (the held-out fifth scores it); resumes from ``records``.

    Args:
        rag: The pipeline of the model (its selection rule is the student's).
        questions: Calibration questions only (never the report split).
        records: Where the checkpoint of each pass is kept.
        params: Decoding of the teacher's answers.
        ratio: The reused chunks' recomputation ratio in the student.
        num_tokens: Rows of the bridge.
        epochs: Passes over the fitting questions.
        learning_rate: Adam's step, relative to the bridge's starting RMS.
        seed: Order of the questions in each pass.
        progress: Where each line of progress goes.
    """
    started = time.perf_counter()
    engine = rag.engine
    selection = rag.config.selection
    scorer = learned_controls(rag.config.cache.recompute, rag.profile).token_scorer
    student = Student(ratio, selection, scorer)
    storage = KVCodec(rag.config.cache.store.storage_dtype)
    examples = []
    for number, (dataset, item) in enumerate(questions, 1):
        examples.append(teacher_example(rag, item, params, storage))
        if number % 10 == 0 or number == len(questions):
            progress(f"teacher: {number}/{len(questions)} questions ({dataset} {item.qid})")
    held = [e for i, e in enumerate(examples) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1]
    fitting = [e for i, e in enumerate(examples) if i % HELD_OUT_EVERY != HELD_OUT_EVERY - 1]
    initial = initial_bridge(engine, num_tokens)
    bridge = initial.clone().requires_grad_(True)
    scale = float(initial.pow(2).mean().sqrt())
    optimiser = torch.optim.Adam([bridge], lr=learning_rate * scale)
    records.mkdir(parents=True, exist_ok=True)
    checkpoint_path = records / CHECKPOINT
    curve: list[float] = []
    done_epochs = 0
    if checkpoint_path.exists():
        state = torch.load(checkpoint_path, weights_only=True)
        with torch.no_grad():
            bridge.copy_(state["bridge"])
        optimiser.load_state_dict(state["optimiser"])
        curve, done_epochs = list(state["curve"]), int(state["epochs"])
        progress(f"resumed after pass {done_epochs} (loss curve {_curve(curve)})")

    def mean_loss(items: Sequence[PacketExample], rows: torch.Tensor | None) -> float:
        with torch.no_grad():
            return statistics.fmean(float(student_loss(engine, e, rows, student)) for e in items)

    if not curve:
        curve += [mean_loss(fitting, None), mean_loss(fitting, bridge.detach())]
        progress(f"no packet: mean KL {curve[0]:.4f}; its starting rows: {curve[1]:.4f}")
    for epoch in range(done_epochs + 1, epochs + 1):
        shuffled = list(fitting)
        random.Random(seed + epoch).shuffle(shuffled)  # the same order when resumed
        losses = []
        for step, example in enumerate(shuffled, 1):
            optimiser.zero_grad()
            loss = student_loss(engine, example, bridge, student)
            loss.backward()
            torch.nn.utils.clip_grad_norm_([bridge], max_norm=1.0)
            optimiser.step()
            losses.append(float(loss.detach()))
            if step % 20 == 0 or step == len(shuffled):
                progress(
                    f"pass {epoch}/{epochs}: {step}/{len(shuffled)} questions, running KL "
                    f"{statistics.fmean(losses[-20:]):.4f}"
                )
        curve.append(statistics.fmean(losses))
        torch.save(
            {
                "bridge": bridge.detach(),
                "optimiser": optimiser.state_dict(),
                "curve": curve,
                "epochs": epoch,
            },
            checkpoint_path,
        )
    held_out = None
    if held:
        held_out = (mean_loss(held, None), mean_loss(held, bridge.detach()))
        progress(
            f"held out ({len(held)} questions): mean KL {held_out[0]:.4f} -> {held_out[1]:.4f}"
        )
    data = save({BRIDGE: bridge.detach().float().contiguous()}, {"format": "adarag-packet-1"})
    record = PacketRecord(
        file=packet_file_name(engine.checkpoint.name, data),
        digest=hashlib.sha256(data).hexdigest(),
        bridge_tokens=num_tokens,
        ratio=ratio,
        num_questions=len(fitting),
        epochs=epochs,
        loss_curve=tuple(round(x, 5) for x in curve),
        held_out_kl=None if held_out is None else (round(held_out[0], 5), round(held_out[1], 5)),
    )
    (records / "packet-fit.json").write_text(json.dumps(record.to_dict(), indent=1) + "\n")
    return PacketFit(data, record, time.perf_counter() - started)


def _curve(curve: Sequence[float]) -> str:
    return " -> ".join(f"{x:.4f}" for x in curve)
