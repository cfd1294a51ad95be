"""Prometheus metrics (prometheus_client): llama-server's ``llamacpp:*`` names, so its
dashboards work unchanged, beside tensorplug's own (HTTP requests by route and status,
preemptions, KV cells). The generator's counters are read at scrape time; the seconds
spent on prompts and on generation are added up here as requests finish; the
throughput gauges are over the interval since the previous scrape, as llama-server's."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..generation import GeneratorStats

__all__ = ["Bucket", "Metrics", "RequestCounts", "Timings"]


@dataclass
class Bucket:
    """Tokens and the seconds they took; the rate counts ``steps`` (a reply's tokens
    less its first, which comes with the prompt's logits: llama-server's decode steps)."""

    count: int = 0
    steps: int = 0
    seconds: float = 0.0

    def add(self, count: int, steps: int, seconds: float) -> None:
        self.count += count
        self.steps += steps
        self.seconds += seconds

    def per_second(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else 0.0


class Timings:
    """What finished requests took, as llama-server's metrics count it: the seconds
    spent evaluating prompts (until a request's first token) and generating (the rest)
    since the start, the longest sequence seen, and the *buckets*: the same since the
    previous scrape, whose rates are the ``*_tokens_seconds`` gauges (a scrape empties
    them, so a dashboard sees the throughput of its own interval and an idle server
    reports 0)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.prompt_seconds = 0.0
        self.predicted_seconds = 0.0
        self.n_tokens_max = 0
        self._prompt_bucket = Bucket()
        self._predict_bucket = Bucket()

    def add(self, prompt_seconds: float, predicted_seconds: float, counts: RequestCounts) -> None:
        """A request ended: its prompt took ``prompt_seconds``, its reply
        ``predicted_seconds``; ``counts``: its tokens."""
        with self._lock:
            self.prompt_seconds += prompt_seconds
            self.predicted_seconds += predicted_seconds
            self.n_tokens_max = max(self.n_tokens_max, counts.sequence)
            self._prompt_bucket.add(counts.evaluated, counts.evaluated, prompt_seconds)
            steps = max(counts.generated - 1, 0)
            self._predict_bucket.add(counts.generated, steps, predicted_seconds)

    def take_buckets(self) -> tuple[Bucket, Bucket]:
        """The prompt and the reply buckets since the previous call, emptied."""
        with self._lock:
            taken = self._prompt_bucket, self._predict_bucket
            self._prompt_bucket, self._predict_bucket = Bucket(), Bucket()
        return taken


@dataclass(frozen=True)
class RequestCounts:
    """One request's tokens: prompt tokens evaluated (not those found cached), tokens
    generated, and its sequence's length (prompt and reply)."""

    evaluated: int = 0
    generated: int = 0
    sequence: int = 0

    @classmethod
    def of(cls, chunk: dict[str, Any] | None) -> RequestCounts:
        """What a request's last chunk reports: llama-server's ``timings``, OpenAI's
        ``usage`` or ``/completion``'s token counts."""
        if not chunk:
            return cls()
        timings = chunk.get("timings") or {}
        if "prompt_n" in timings:
            prompt, generated = int(timings["prompt_n"]), int(timings.get("predicted_n", 0))
            return cls(prompt, generated, prompt + int(timings.get("cache_n", 0)) + generated)
        usage = chunk.get("usage") or {}
        if "prompt_tokens" in usage:
            cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0))
            prompt, generated = int(usage["prompt_tokens"]), int(usage.get("completion_tokens", 0))
            return cls(prompt - cached, generated, prompt + generated)
        prompt = int(chunk.get("tokens_evaluated", 0))
        generated = int(chunk.get("tokens_predicted", 0))
        return cls(prompt, generated, prompt + generated)


class Metrics:
    """The registry of one app: ``stats`` gives the generator's counters at a scrape
    (an asleep server's as they were, :mod:`.sleep`), ``in_flight`` the requests
    admitted."""

    def __init__(self, stats: Callable[[], GeneratorStats], in_flight: Callable[[], int]) -> None:
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
        self.registry.register(_GeneratorCollector(stats, self.timings))  # type: ignore[arg-type]

    def exposition(self) -> str:
        """The scrape, in Prometheus' text format: the registry's metrics, then
        ``llamacpp:n_tokens_max`` as llama-server writes it, a counter (a high
        watermark never falls) named without ``_total``, which prometheus_client adds to
        every counter it writes; llama-server's dashboards and tests read that name."""
        watermark = (
            "# HELP llamacpp:n_tokens_max Largest observed sequence length (prompt + "
            "generation).\n# TYPE llamacpp:n_tokens_max counter\n"
            f"llamacpp:n_tokens_max {float(self.timings.n_tokens_max)}\n"
        )
        return generate_latest(self.registry).decode() + watermark


class _GeneratorCollector:
    """The generator's counters, and generation tokens/s since the previous scrape."""

    def __init__(self, stats: Callable[[], GeneratorStats], timings: Timings) -> None:
        self.stats, self.timings = stats, timings
        self._last = (time.monotonic(), 0)

    def collect(self) -> Iterator[Any]:
        s = self.stats()
        t = self.timings
        prompt_bucket, predict_bucket = t.take_buckets()
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
                "Average prompt throughput in tokens/s (since the previous scrape).",
                prompt_bucket.per_second(),
            ),
            "llamacpp:predicted_tokens_seconds": (
                "Average generation throughput in tokens/s (since the previous scrape).",
                predict_bucket.per_second(),
            ),
            "llamacpp:requests_processing": ("Number of requests processing.", s.running),
            "llamacpp:requests_deferred": ("Number of requests deferred.", s.waiting),
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
