"""``GET /metrics``: the server's Prometheus metrics (``prometheus-client``).

Counted as requests are served: answers' time to first token, recomputed share, end-to-end
latency and time per output token (histograms), the tokens they generated, and requests by route
and outcome (the latency and token metrics are vLLM's ``vllm:e2e_request_latency_seconds``,
``vllm:time_per_output_token_seconds`` and ``vllm:generation_tokens_total`` under adarag's
prefix). Read when scraped: active and queued requests,
the cache's lookups by tier (``miss`` included), prompt and recomputed tokens, and the KV store's
bytes, entries and evictions per layer. Each application has a registry of its own, so several
servers in one process never share a metric.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from adarag.pipeline import CacheReport
from adarag.schema import QueryTrace

Outcome = Literal["ok", "invalid", "rejected", "timeout", "unavailable", "error", "cancelled"]
"""How a request ended: answered, bad input (400, or 409: an empty knowledge base), queue full
(429), past its deadline (504), shutting down or a backend down (503), a server failure (500),
or the client went away."""

TTFT_BUCKETS_S = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
RATIO_BUCKETS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0)
LATENCY_BUCKETS_S = (0.1, 0.3, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
TOKEN_TIME_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0)
_OUTCOMES = {400: "invalid", 409: "invalid", 429: "rejected", 503: "unavailable", 504: "timeout"}


def outcome_of(status: int) -> Outcome:
    """The outcome an HTTP error status stands for."""
    return _OUTCOMES.get(status, "error")  # type: ignore[return-value]


class ServerMetrics:
    """The metrics of one server.

    Args:
        num_active: The requests the engine works on now.
        num_queued: The requests waiting for it.
        cache_stats: The cache's statistics (the server opens the cache before it serves).
    """

    def __init__(
        self,
        num_active: Callable[[], int],
        num_queued: Callable[[], int],
        cache_stats: Callable[[], CacheReport],
    ) -> None:
        self.registry = CollectorRegistry()
        self.ttft = Histogram(
            "adarag_time_to_first_token_seconds",
            "Seconds from a request's arrival at the engine to its first token (retrieval and "
            "prefill), per answer with context",
            buckets=TTFT_BUCKETS_S,
            registry=self.registry,
        )
        self.recomputed = Histogram(
            "adarag_recomputed_ratio",
            "Share of an answer's prompt tokens recomputed rather than reused from the cache",
            buckets=RATIO_BUCKETS,
            registry=self.registry,
        )
        self.latency = Histogram(
            "adarag_e2e_request_latency_seconds",
            "Seconds from a request's arrival (queue included) to its answer's last token, per "
            "answer",
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.token_time = Histogram(
            "adarag_time_per_output_token_seconds",
            "Seconds per generated token after the first (decoding time over the tokens after "
            "the first), per answer of two tokens or more",
            buckets=TOKEN_TIME_BUCKETS_S,
            registry=self.registry,
        )
        self.generated = Counter(
            "adarag_generation_tokens",
            "Tokens generated in the answers served",
            registry=self.registry,
        )
        self.requests = Counter(
            "adarag_requests",
            "Requests by route and outcome",
            ["route", "outcome"],
            registry=self.registry,
        )
        Gauge(
            "adarag_active_requests", "Requests the engine works on", registry=self.registry
        ).set_function(num_active)
        Gauge(
            "adarag_queued_requests", "Requests waiting for the engine", registry=self.registry
        ).set_function(num_queued)
        self.registry.register(_CacheCollector(cache_stats))

    def observe_prefill(self, trace: QueryTrace) -> None:
        """Record an answer's TTFT and recomputed share once it is prefilled."""
        if trace.stop_reason == "no_context":
            return  # nothing was prefilled
        self.ttft.observe(trace.ttft_s)
        self.recomputed.observe(min(trace.recomputed_ratio, 1.0))

    def observe_answer(self, num_tokens: int, latency_s: float, decode_s: float) -> None:
        """Record an answer of ``num_tokens`` once its last token is out.

        Args:
            num_tokens: Its generated tokens.
            latency_s: Seconds from the request's arrival to the answer's end.
            decode_s: Seconds from its first token to its end.
        """
        self.latency.observe(latency_s)
        self.generated.inc(num_tokens)
        if num_tokens >= 2:
            self.token_time.observe(decode_s / (num_tokens - 1))

    def count(self, route: str, outcome: Outcome) -> None:
        """Count a request of ``route`` that ended with ``outcome``."""
        self.requests.labels(route=route, outcome=outcome).inc()

    def exposition(self) -> bytes:
        """Every metric in Prometheus's text format."""
        return generate_latest(self.registry)


class _CacheCollector(Collector):
    """The cache's own counters and the store's sizes, read when scraped."""

    def __init__(self, cache_stats: Callable[[], CacheReport]) -> None:
        self._cache_stats = cache_stats

    def collect(self) -> Iterator[Metric]:
        """The cache's metrics."""
        report = self._cache_stats()
        lookups = CounterMetricFamily(
            "adarag_kv_lookups",
            "Chunk-KV lookups by the tier that served them (miss: computed in full)",
            labels=["tier"],
        )
        for tier, count in sorted(dict(report.tiers.hits).items()):
            lookups.add_metric([tier], count)
        yield lookups
        yield CounterMetricFamily(
            "adarag_prompt_tokens",
            "Prompt tokens prefilled through the cache",
            value=report.tiers.num_prompt_tokens,
        )
        yield CounterMetricFamily(
            "adarag_recomputed_tokens",
            "Prompt tokens recomputed instead of reused",
            value=report.tiers.num_recomputed_tokens,
        )
        store = report.store
        for name, doc, memory, disk in (
            ("bytes", "Bytes of chunk KV held", store.memory_bytes, store.disk_bytes),
            ("entries", "Chunk-KV entries held", store.memory_entries, store.disk_entries),
        ):
            family = GaugeMetricFamily(f"adarag_kv_store_{name}", doc, labels=["layer"])
            family.add_metric(["memory"], memory)
            family.add_metric(["disk"], disk)
            yield family
        evictions = CounterMetricFamily(
            "adarag_kv_store_evictions", "Chunk-KV entries evicted", labels=["layer"]
        )
        evictions.add_metric(["memory"], store.memory_evictions)
        evictions.add_metric(["disk"], store.disk_evictions)
        yield evictions


def metrics_router(metrics: ServerMetrics, check_key: Callable[[Request], None]) -> APIRouter:
    """``GET /metrics``, behind the API key (a Prometheus scrape sends it as a bearer token)."""
    router = APIRouter(dependencies=[Depends(check_key)])

    @router.get("/metrics", include_in_schema=False)
    async def scrape() -> Response:
        body = await asyncio.to_thread(metrics.exposition)  # the store's lock may be held
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return router
