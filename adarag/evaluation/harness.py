"""Running a policy over a query stream and recording every query."""

from __future__ import annotations

import logging
import os
import shutil
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from adarag.config import AdaRagConfig
from adarag.conversation import Conversation
from adarag.engine.core import Engine
from adarag.evaluation.metrics import best_exact_match, best_f1
from adarag.evaluation.workload import BenchQuestion, StreamItem, distinct_chunks
from adarag.pipeline import AdaRAG
from adarag.policies import Policy
from adarag.schema import Answer, GenerationParams, QueryTrace

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class QueryRecord:
    """What one query of the stream did and cost."""

    policy: str
    qid: str
    is_repeat: bool
    top_k: int
    ttft_s: float
    num_prompt_tokens: int
    num_processed_tokens: int
    num_recomputed_tokens: int
    num_chunks_used: int
    stop_reason: str
    tier_hits: dict[str, int]
    confidence_s: float
    prefill_s: float
    answer: str
    f1: float
    exact_match: float
    store_memory_bytes: int
    step_confidences: list[float] = field(default_factory=list)
    qtype: str | None = None
    position: int = -1
    """The query's index in the stream (a scheduling policy may run it at another time)."""
    conversation: str | None = None


class BenchRunner:
    """Runs policies over one workload, each with a fresh cache that starts from the same ingest.

    Args:
        engine: The model, shared by every policy.
        base_config: Configuration the policies' overrides apply to.
        work_dir: Scratch space for the ingest cache and each policy's cache.
        params: Decoding options of every query.
        keep_logits: Keep each query's first-token logits in :attr:`logits` (for agreement).
    """

    def __init__(
        self,
        engine: Engine,
        base_config: AdaRagConfig,
        work_dir: Path,
        params: GenerationParams,
        keep_logits: bool = False,
    ) -> None:
        self.engine = engine
        self.base_config = base_config
        self.work_dir = work_dir
        self.params = params
        self.keep_logits = keep_logits
        self.logits: dict[str, dict[int, torch.Tensor]] = {}
        """Per policy, each stream position's first-token logits (with ``keep_logits``)."""
        self._ingest_dir: Path | None = None

    def ingest(self, questions: Sequence[BenchQuestion]) -> int:
        """Precompute every chunk's independent KV once (the ingest path); returns how many."""
        home = self.work_dir / "ingest"
        config = AdaRagConfig.build(self.base_config, home=home)
        rag = AdaRAG(config, loaded_engine=self.engine)
        count = rag.warm(distinct_chunks(questions))
        self._ingest_dir = rag.kv_directory
        return count

    def run(
        self,
        policy: Policy,
        questions: Sequence[BenchQuestion],
        stream: Sequence[StreamItem],
        top_k: int,
    ) -> list[QueryRecord]:
        """Answer the stream under ``policy``; its cache starts from the ingest (if it uses it)."""
        home = self.work_dir / policy.name
        rag = self._pipeline(policy, questions, home)
        order = list(range(len(stream)))
        has_conversations = any(q.conversation is not None for q in questions)
        if (
            rag.config.experimental.arrangement.reorder == "longest_prefix"
            and not has_conversations
        ):
            batch = [questions[item.question_idx].chunks[:top_k] for item in stream]
            order = rag.schedule(batch)  # prefix-sharing requests back to back (RAGBoost)
        conversations: dict[str, Conversation] = {}
        logits = self.logits.setdefault(policy.name, {})
        records = []
        for position in order:
            item = stream[position]
            question = questions[item.question_idx]
            conversation = None
            if question.conversation is not None:
                conversation = conversations.setdefault(question.conversation, Conversation())
            stream_answer = rag.stream(
                question.question,
                chunks=question.chunks[:top_k],
                params=self.params,
                history=conversation.history() if conversation else (),
                conversation_chunks=conversation.chunks if conversation else (),
            )
            if self.keep_logits and stream_answer.first_token_logits is not None:
                logits[position] = stream_answer.first_token_logits.float().cpu().clone()
            answer = stream_answer.answer()
            if conversation is not None:
                conversation.add_turn(question.question, answer.text, chunks=answer.chunks)
            records.append(_record(policy, rag, question, item, position, answer, top_k))
            logger.info(
                "%s %d/%d %s ttft %.2f s, %d chunks, %s",
                policy.name,
                len(records),
                len(stream),
                question.qid,
                answer.trace.ttft_s,
                answer.trace.num_chunks_used,
                records[-1].tier_hits,
            )
        shutil.rmtree(home, ignore_errors=True)
        return records

    def _pipeline(self, policy: Policy, questions: Sequence[BenchQuestion], home: Path) -> AdaRAG:
        """``policy``'s pipeline in a fresh ``home``, its cache starting from the ingest."""
        shutil.rmtree(home, ignore_errors=True)
        rag = AdaRAG(policy.config(self.base_config, home=home), loaded_engine=self.engine)
        kv_dir = rag.kv_directory
        kv_dir.mkdir(parents=True)
        if policy.uses_independent_tier and self._ingest_dir is not None:
            for path in self._ingest_dir.iterdir():
                os.link(path, kv_dir / path.name)  # shared read-only files, no copy
        # the system prefix (and FusionRAG's fused KV of every chunk), outside the timed queries
        rag.warm(distinct_chunks(questions) if policy.uses_fused_tier else [])
        return rag


def _record(
    policy: Policy,
    rag: AdaRAG,
    question: BenchQuestion,
    item: StreamItem,
    position: int,
    answer: Answer,
    top_k: int,
) -> QueryRecord:
    """One answered request of the stream."""
    trace = answer.trace
    return QueryRecord(
        policy=policy.name,
        qid=question.qid,
        is_repeat=item.is_repeat,
        top_k=top_k,
        ttft_s=trace.ttft_s,
        num_prompt_tokens=trace.num_prompt_tokens,
        num_processed_tokens=trace.num_processed_tokens,
        num_recomputed_tokens=trace.num_recomputed_tokens,
        num_chunks_used=trace.num_chunks_used,
        stop_reason=trace.stop_reason,
        tier_hits=dict(_entry_tiers(trace)),
        confidence_s=sum(step.confidence_s for step in trace.steps),
        prefill_s=sum(step.prefill_s for step in trace.steps),
        answer=answer.text,
        f1=best_f1(answer.text, question.answers),
        exact_match=best_exact_match(answer.text, question.answers),
        store_memory_bytes=rag.cache_stats().store.memory_bytes,
        step_confidences=[s.confidence or 0.0 for s in trace.steps],
        qtype=question.qtype,
        position=position,
        conversation=question.conversation,
    )


def _entry_tiers(trace: QueryTrace) -> Counter[str]:
    """The tier each chunk came from when it entered the prompt.

    A static query has one step holding every chunk; an augmented one adds its last chunk at each
    step (the earlier ones are the previous steps' hard hits).
    """
    tiers: Counter[str] = Counter(trace.steps[0].tiers[:-1])
    tiers.update(step.tiers[-1] for step in trace.steps)
    return tiers
