"""How the commands show an answer: streamed text, then sources, TTFT and cache tiers."""

from __future__ import annotations

import math
import sys
from collections import Counter
from pathlib import Path
from typing import TextIO

from adarag.pipeline.answer_stream import AnswerStream
from adarag.schema import Answer, Chunk


def stream_answer(stream: AnswerStream, out: TextIO | None = None) -> Answer:
    """Print deltas as they arrive (to ``out``, else the current stdout); return the answer."""
    out = out or sys.stdout
    for delta in stream:
        out.write(delta)
        out.flush()
    out.write("\n")
    return stream.answer()


def describe(answer: Answer) -> list[str]:
    """Lines with the answer's figures: TTFT, tokens, tiers, stop reason and sources."""
    trace = answer.trace
    if trace.stop_reason == "no_context":
        return ["   no chunk of the knowledge base is relevant enough (stop: no_context)"]
    tiers = Counter(trace.steps[-1].tiers) if trace.steps else Counter()
    tier_text = ", ".join(f"{tier} x{count}" for tier, count in sorted(tiers.items()))
    lines = [
        f"   TTFT {trace.ttft_s:.2f} s | prompt {trace.num_prompt_tokens} tokens, "
        f"{trace.num_recomputed_tokens} recomputed ({trace.recomputed_ratio:.1%}), "
        f"{answer.num_cached_tokens} from cache | tiers: {tier_text or '-'} | "
        f"{len(trace.steps)} step(s), stop: {trace.stop_reason}",
    ]
    last = trace.steps[-1] if trace.steps else None
    if last is not None and last.rungs:
        climb = " -> ".join(f"{ratio:g}" for ratio in last.rungs)
        parts = [f"routed {climb}" if last.routed else f"kept at {climb}"]
        if last.agreement_probability is not None:
            parts.append(f"P(agrees with full) {last.agreement_probability:.2f}")
        if last.reused_entropy is not None and not math.isnan(last.reused_entropy):
            parts.append(f"entropy over reused KV {last.reused_entropy:.2f} nats")
        lines.append("   routing: " + " | ".join(parts))
    lines.extend(f"   source {idx}: {_label(chunk)}" for idx, chunk in enumerate(answer.chunks, 1))
    return lines


def _label(chunk: Chunk) -> str:
    """Score, then where the chunk is from: file, chunk number, page or row, title, heading.

    The file is shown relative to the working directory when under it; the chunk id when
    nothing else is known.
    """
    metadata = chunk.metadata
    parts = []
    if metadata.get("source"):
        parts.append(_shown_path(str(metadata["source"])))
    if isinstance(metadata.get("chunk_idx"), int) and metadata.get("file_num_chunks"):
        parts.append(f"chunk {metadata['chunk_idx'] + 1}/{metadata['file_num_chunks']}")
    for place in ("page", "row"):  # a PDF's page, a CSV file's row
        if isinstance(metadata.get(place), int):
            parts.append(f"{place} {metadata[place]}")
    if metadata.get("title"):
        parts.append(repr(str(metadata["title"])))
    if metadata.get("heading"):
        parts.append(f"§ {metadata['heading']}")
    score = f"[{chunk.score:.2f}] " if chunk.score is not None else ""
    return score + (", ".join(parts) or str(chunk.chunk_id))


def _shown_path(source: str) -> str:
    path = Path(source)
    try:
        return str(path.relative_to(Path.cwd())) if path.is_absolute() else source
    except ValueError:
        return source
