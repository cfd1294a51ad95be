"""Prometheus metrics (prometheus_client): llama-server's ``llamacpp:*`` names, so its
dashboards work unchanged, beside tensorplug's own (HTTP requests by route and status,
preemptions, KV cells). The generator's counters are read at scrape time; the seconds
spent on prompts and on generation are added up here as requests finish."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..api import LLM

__all__ = ["Metrics", "Timings"]


class Timings:
    """Seconds spent evaluating prompts (until a request's first token) and generating
    (the rest), and the longest sequence seen: llama-server's per-slot totals."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.prompt_seconds = 0.0
        self.predicted_seconds = 0.0
        self.n_tokens_max = 0

    def add(self, prompt_seconds: float, predicted_seconds: float, n_tokens: int) -> None:
        with self._lock:
            self.prompt_seconds += prompt_seconds
            self.predicted_seconds += predicted_seconds
            self.n_tokens_max = max(self.n_tokens_max, n_tokens)


class Metrics:
    def __init__(self, llm: LLM, in_flight: Callable[[], int]) -> None:
        self.timings = Timings()
        self.registry = CollectorRegistry()
        self.http = Counter(
            "tensorplug_http_requests",
            "HTTP requests answered, by route and status",
            ["route", "status"],
            registry=self.registry,
        )
        self.rejected = Counter(
            "tensorplug_rejected_requests",
            "requests refused with 503 because the queue was full",
            registry=self.registry,
        )
        Gauge(
            "tensorplug_http_in_flight", "requests admitted and not yet answered",
            registry=self.registry,
        ).set_function(lambda: in_flight())  # fmt: skip
        self.registry.register(_GeneratorCollector(llm, self.timings))  # type: ignore[arg-type]


class _GeneratorCollector:
    """The generator's counters, and generation tokens/s since the previous scrape."""

    def __init__(self, llm: LLM, timings: Timings) -> None:
        self.llm, self.timings = llm, timings
        self._last = (time.monotonic(), 0)

    def collect(self) -> Iterator[Any]:
        s = self.llm.stats()
        t = self.timings
        now = time.monotonic()
        then, before = self._last
        self._last = (now, s.generated_tokens_total)
        rate = (s.generated_tokens_total - before) / max(now - then, 1e-9)
        usage = s.kv_cells_used / max(s.kv_cells_total, 1)
        counters = {
            "llamacpp:prompt_tokens": ("Number of prompt tokens processed.", s.prompt_tokens_total),
            "llamacpp:prompt_seconds": ("Prompt process time in seconds.", t.prompt_seconds),
            "llamacpp:tokens_predicted": (
                "Number of generation tokens processed.", s.generated_tokens_total
            ),
            "llamacpp:tokens_predicted_seconds": (
                "Predict process time in seconds.", t.predicted_seconds
            ),
            "llamacpp:prompt_tokens_cached": (
                "Number of prompt tokens taken from the cache.", s.prompt_tokens_reused
            ),
            "llamacpp:n_decode": ("Number of llama_decode() calls.", s.decode_steps),
            # tensorplug drafts nothing (no speculative decoding): always 0
            "llamacpp:spec_decode_num_draft_tokens": ("Number of draft tokens generated.", 0),
            "llamacpp:spec_decode_num_accepted_tokens": ("Number of draft tokens accepted.", 0),
            "llamacpp:spec_decode_num_drafts": ("Number of drafts generated.", 0),
            "tensorplug_prompt_tokens": ("prompt tokens evaluated", s.prompt_tokens_total),
            "tensorplug_generated_tokens": ("tokens generated", s.generated_tokens_total),
            "tensorplug_requests": ("requests given to the generator", s.requests_total),
            "tensorplug_preemptions": (
                "running requests preempted (cells freed, resumed later) when the KV cache "
                "was full",
                s.preemptions,
            ),
        }  # fmt: skip
        for name, (doc, value) in counters.items():
            yield CounterMetricFamily(name, doc, value=value)
        gauges = {
            "llamacpp:prompt_tokens_seconds": (
                "Average prompt throughput in tokens/s.",
                s.prompt_tokens_total / t.prompt_seconds if t.prompt_seconds else 0.0,
            ),
            "llamacpp:predicted_tokens_seconds": (
                "Average generation throughput in tokens/s.",
                s.generated_tokens_total / t.predicted_seconds if t.predicted_seconds else 0.0,
            ),
            "llamacpp:requests_processing": ("Number of requests processing.", s.running),
            "llamacpp:requests_deferred": ("Number of requests deferred.", s.waiting),
            "llamacpp:n_tokens_max": (
                "High watermark of the context size observed.", t.n_tokens_max
            ),
            "llamacpp:n_busy_slots_per_decode": (
                "Average number of busy slots per llama_decode() call.", s.busy_slots_per_step
            ),
            "llamacpp:kv_cache_usage_ratio": ("KV-cache usage. 1 means 100 percent usage.", usage),
            "llamacpp:kv_cache_tokens": ("KV-cache tokens.", s.kv_cells_used),
            "tensorplug_generation_tokens_per_second": ("tokens/s since the last scrape", rate),
            "tensorplug_requests_running": ("requests holding a slot", s.running),
            "tensorplug_requests_waiting": ("requests waiting for a slot (queue depth)", s.waiting),
            "tensorplug_slots": ("parallel sequences (-np)", s.n_parallel),
            "tensorplug_kv_cells_used": ("KV cache cells holding tokens", s.kv_cells_used),
            "tensorplug_kv_cells_total": ("KV cache cells (the context)", s.kv_cells_total),
            "tensorplug_kv_cache_usage_ratio": ("used / total KV cells", usage),
        }  # fmt: skip
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(name, doc, value=value)
