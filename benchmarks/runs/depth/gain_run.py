"""``depth.py gain``: each question's chunk gains and the answers of every set a rule can pick.

Per question, over its top-K retrieved chunks (real retrieval, ``depth.py retrieve``):

- every chunk's independent KV (as ingest stores it) and its information gain from one batched
  pass of the question over the K cached contexts and the empty one (``scoring_s``);
- the answer with no context and with each chunk alone (decoded in one batch from that pass:
  each is the full-recomputation answer of its one-chunk prompt);
- fixed top-k for k = 1..K and the top-k by gain for k = 1..K, each step's answer the
  full-recomputation answer of its prompt (the hard tier reuses the steps before it exactly,
  float32 store), with each step's lens confidence;
- in retrieval order, the set each τ of :data:`~adarag.evaluation.gain_depth.THRESHOLDS` keeps,
  prefilled in full when it is not already a prefix;
- every third question, timed full prefills (the TTFT fit) and the scoring pass at N = 6 and 12
  beside full prefills of those prompts (the cost of scoring).

One JSON line per question in ``<cache>/gain[-calibration]/<model>/<dataset>.jsonl``; a stopped
run resumes after the questions written.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from common import CACHE

from adarag.augment.gain import information_gain, kept_chunks
from adarag.engine.context_pass import each_chunk_alone
from adarag.engine.prefill_request import PrefillRequest
from adarag.evaluation.gain_depth import THRESHOLDS, subset_key
from adarag.evaluation.metrics import best_f1
from adarag.evaluation.reuse import independent_chunks
from adarag.schema import Chunk, GenerationParams
from runs.depth.run import hard_tier_pipeline
from runs.depth.splits import MAX_K, recorded_qids, retrieved_path

GAIN_ROWS = {"report": CACHE / "gain", "calibration": CACHE / "gain-calibration"}
COST_EVERY = 3
COST_SIZES = (6, 12)


def gain_run(args: argparse.Namespace) -> None:
    """Record every question of ``args.dataset`` (resuming)."""
    out = GAIN_ROWS[args.split] / args.model_dir / f"{args.dataset}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    done = recorded_qids(out)
    items = [json.loads(line) for line in retrieved_path(args.dataset, args.split).open()]
    # each step keeps its own KV cache, so that every answer decodes in one batch at the end
    rag = hard_tier_pipeline(args.model, args.threads, reuse_step_kv=False)
    params = GenerationParams(max_new_tokens=args.max_new_tokens)
    _question(rag, _warm_up_item(), 0, 2, params, timed=False)
    for index, item in enumerate(items[: args.questions]):
        if item["qid"] in done:
            continue
        started = time.perf_counter()
        row = _question(rag, item, index, args.max_k, params, timed=index % COST_EVERY == 0)
        row["wall_s"] = time.perf_counter() - started
        with out.open("a") as handle:
            handle.write(json.dumps(row) + "\n")
        fixed = " ".join(f"{100 * s['f1']:.0f}" for s in row["fixed"])
        gains = " ".join(f"{g:+.2f}" for g in row["gains"])
        print(f"[{index}] {row['wall_s']:.1f} s  F1 by k: {fixed}  gains: {gains}", flush=True)


def _warm_up_item() -> dict:
    chunks = [{"text": "A short passage.", "id": "a", "score": 1.0}] * 2
    return {"qid": "warm-up", "question": "warm-up?", "answers": ["x"], "chunks": chunks}


def _question(rag, item: dict, index: int, max_k: int, params: GenerationParams, timed: bool):
    engine, question, gold = rag.engine, item["question"], item["answers"]
    retrieved = [Chunk(c["text"], c["id"], c["score"]) for c in item["chunks"]]
    chunks = retrieved[:max_k]
    layout = rag.layout(question, chunks, params)
    begun = time.perf_counter()
    system_kv, chunk_kvs = independent_chunks(engine, layout)
    chunk_s = time.perf_counter() - begun
    # one pass scores the gains and leaves each context's cache to decode its answer from
    passed, gains, scoring_s = _scored(engine, layout, system_kv, chunk_kvs, params.max_new_tokens)
    answers = [_text(engine, ids) for ids in engine.greedy_answers(passed, params.max_new_tokens)]

    def answered(answer: str, tokens: int) -> dict:
        return {"answer": answer, "f1": best_f1(answer, gold), "tokens": tokens}

    def prefilled(order: list[int]) -> list[tuple[Any, float]]:
        """Each step of ``order``'s prompt (kept undecoded) with its lens confidence."""
        augmentation = rag.augmentation
        ordered = rag.layout(question, [chunks[i] for i in order], params)
        return [
            (step, augmentation.controller.score(k, step.result).confidence.value)
            for k, step in enumerate(augmentation.prefill_steps(ordered, params.max_new_tokens), 1)
        ]

    fixed_steps = prefilled(list(range(len(chunks))))
    ranking = kept_chunks(gains, float("-inf"))
    same = ranking == list(range(len(chunks)))
    gain_steps = fixed_steps if same else prefilled(ranking)
    subsets: dict[str, tuple[Any, Any]] = {}
    for threshold in THRESHOLDS:
        kept = kept_chunks(gains, threshold, "retrieval")
        key = subset_key(kept)
        known = len(kept) == 1 or kept in (list(range(len(kept))), ranking[: len(kept)])
        if known or key in subsets:
            continue
        sub = rag.layout(question, [chunks[i] for i in kept], params)
        subsets[key] = (
            sub,
            engine.prefill(PrefillRequest(sub, max_new_tokens=params.max_new_tokens)),
        )
    # every prompt's answer decoded in one batch (each gets the tokens it gets alone)
    prompts = [
        *((step.layout, step.output) for step, _ in fixed_steps),
        *(() if same else ((step.layout, step.output) for step, _ in gain_steps)),
        *subsets.values(),
    ]
    decoded = engine.decoder.decode_batch(
        [layout for layout, _ in prompts], [output for _, output in prompts], params
    )
    texts = iter(_text(engine, ids) for ids in decoded)

    def stepped(steps: list[tuple[Any, float]]) -> list[dict]:
        rows = []
        for step, confidence in steps:
            row = answered(next(texts), step.layout.num_tokens)
            row.update(
                processed=step.result.num_processed_tokens,
                step_s=step.result.prefill_s + step.result.confidence_s,
                confidence=confidence,
                margin=step.result.margin,
            )
            rows.append(row)
        return rows

    fixed = stepped(fixed_steps)
    by_gain = fixed if same else stepped(gain_steps)
    subset_rows = {key: answered(next(texts), sub.num_tokens) for key, (sub, _) in subsets.items()}
    row = {
        "qid": item["qid"],
        "index": index,
        "type": item.get("type"),
        "scores": [c.score for c in chunks],
        "gold": [c.get("gold") for c in item["chunks"][:max_k]],
        "gains": gains,
        "chunk_s": chunk_s,
        "scoring_s": scoring_s,
        "none": answered(answers[0], layout.with_chunks(0).num_tokens),
        "single": [
            answered(answer, layout.with_chunks(0).num_tokens + len(ids))
            for answer, ids in zip(answers[1:], layout.chunk_ids, strict=True)
        ],
        "fixed": fixed,
        "gain_order": ranking,
        "by_gain": by_gain,
        "subsets": subset_rows,
        "static": _static(rag, question, retrieved, params, index) if timed else [],
        "cost": _cost(rag, question, retrieved, params) if timed else {},
    }
    return row


def _text(engine, ids) -> str:
    return engine.tokenizer.decode(list(ids), skip_special_tokens=True).strip()


def _static(rag, question: str, chunks: list[Chunk], params: GenerationParams, index: int):
    """Timed full prefills of top-K and of one more depth (cycling), for the TTFT fit."""
    timed = []
    for k in (len(chunks), 1 + (index // COST_EVERY) % (len(chunks) - 1)):
        layout = rag.layout(question, chunks[:k], params)
        begun = time.perf_counter()
        rag.engine.prefill(PrefillRequest(layout, max_new_tokens=params.max_new_tokens))
        timed.append({"k": k, "tokens": layout.num_tokens, "seconds": time.perf_counter() - begun})
    return timed


def _scored(engine, layout, system_kv, chunk_kvs, reserve_rows: int = 0):
    """The scoring pass over ``layout``'s chunks: its output, the gains and its seconds."""
    begun = time.perf_counter()
    passed = engine.query_over_contexts(
        layout.query_ids, each_chunk_alone(system_kv, chunk_kvs), reserve_rows
    )
    gains = information_gain(passed.logits)
    return passed, gains, time.perf_counter() - begun


def _cost(rag, question: str, chunks: list[Chunk], params: GenerationParams) -> dict:
    """Seconds of the scoring pass over N cached chunks beside a full prefill of top-N."""
    engine, cost = rag.engine, {}
    sizes = [size for size in COST_SIZES if size <= len(chunks)]
    if not sizes:
        return cost
    # every chunk's KV once, for the largest N; a smaller N scores its first chunks
    largest = rag.layout(question, chunks[: sizes[-1]], params)
    system_kv, chunk_kvs = independent_chunks(engine, largest)
    for size in sizes:
        layout = rag.layout(question, chunks[:size], params)
        _, _, scoring_s = _scored(engine, layout, system_kv, chunk_kvs[:size])
        begun = time.perf_counter()
        engine.prefill(PrefillRequest(layout, max_new_tokens=params.max_new_tokens))
        cost[str(size)] = {"scoring_s": scoring_s, "full_s": time.perf_counter() - begun}
    return cost


assert MAX_K >= max(COST_SIZES)
