"""The query over several cached contexts at once: N next-token distributions in one pass.

Each context is a list of cached segments (e.g. the system prefix and one chunk's independent
KV) laid out from position 0. The query's tokens follow each context at its own positions; the
projections and MLPs multiply every context's query rows at once (the weights are read once),
and attention runs per context over its own cache. What it gives is exactly what a prefill of
``context + query`` computes from that cached KV, with nothing of the context recomputed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from adarag.engine.kv_cache import KVCache
from adarag.engine.layer_stack import LayerStack
from adarag.engine.runner import Runner
from adarag.errors import InputError
from adarag.kv import ChunkKV


@dataclass(frozen=True)
class ContextPass:
    """The query's last-token logits over each context, and each context's cache.

    Attributes:
        logits: [num_contexts, vocab] float32.
        caches: Per context, its KV cache holding the context and the query (rows reserved for
            decoding after them), e.g. to decode each context's answer in a batch.
    """

    logits: torch.Tensor
    caches: tuple[KVCache, ...]


def each_chunk_alone(system_kv: ChunkKV, chunk_kvs: Sequence[ChunkKV]) -> list[list[ChunkKV]]:
    """The contexts information gain compares: the system prefix alone, then with each chunk."""
    return [[system_kv], *([system_kv, kv] for kv in chunk_kvs)]


@torch.inference_mode()
def query_over_contexts(
    stack: LayerStack,
    query_ids: Sequence[int],
    contexts: Sequence[Sequence[ChunkKV]],
    reserve_rows: int = 0,
) -> ContextPass:
    """Run ``query_ids`` after each context of ``contexts`` (keys re-rotated into place).

    Args:
        stack: The decoder layers.
        query_ids: The query's token ids (the prompt's suffix after the context).
        contexts: Each a sequence of cached segments placed one after another from position 0.
        reserve_rows: Rows left free after each context's query (for decoding).

    Raises:
        InputError: No query tokens or no contexts.
    """
    if not query_ids:
        raise InputError("the query has no tokens to run over the contexts")
    if not contexts:
        raise InputError("no contexts to run the query over")
    num_query = len(query_ids)
    caches, positions = [], []
    for segments in contexts:
        length = sum(segment.num_tokens for segment in segments)
        kv = stack.new_cache(length + num_query + reserve_rows)
        start = 0
        for segment in segments:
            kv.load(start, segment, stack.inv_freq, stack.backend)
            start += segment.num_tokens
        kv.length = length + num_query
        caches.append(kv)
        positions.append(torch.arange(length, length + num_query, device=stack.device))
    ids = torch.tensor(list(query_ids) * len(contexts), dtype=torch.int64)
    all_positions = torch.cat(positions)
    hidden = stack.model.embed(ids.to(stack.device)).to(stack.dtype)
    cos_sin = stack.cos_sin(all_positions)
    for layer_idx, layer in enumerate(stack.model.decoder_layers):
        q, k, v = stack.project(layer_idx, hidden, cos_sin)
        rows = []
        for idx, kv in enumerate(caches):
            own = slice(idx * num_query, (idx + 1) * num_query)
            stack.write(kv, layer_idx, k[own], v[own], all_positions[own])
            rows.append(stack.attend(layer_idx, q[own], all_positions[own], kv))
        hidden = layer.finish(hidden, torch.cat(rows))
    last = hidden[num_query - 1 :: num_query]
    return ContextPass(stack.model.logits(last).float(), tuple(caches))


def greedy_answers(
    runner: Runner,
    passed: ContextPass,
    max_new_tokens: int,
    eos_token_ids: frozenset[int],
) -> list[list[int]]:
    """Each context's greedy answer decoded in one batch (EOS not included).

    Every step appends one token to each unfinished context's cache (``reserve_rows`` of
    :func:`query_over_contexts` must cover ``max_new_tokens``); a finished context drops out.
    """
    answers: list[list[int]] = [[] for _ in passed.caches]
    live = list(range(len(passed.caches)))
    logits = passed.logits
    for _ in range(max_new_tokens):
        tokens = logits.argmax(dim=-1).tolist()
        still = []
        for row, token in zip(live, tokens, strict=True):
            if token not in eos_token_ids:
                answers[row].append(int(token))
                still.append(row)
        live = [row for row in still if len(answers[row]) < max_new_tokens]
        if not live:
            break
        logits = runner.decode_batch(
            [answers[row][-1] for row in live], [passed.caches[row] for row in live]
        )
    return answers
