"""Prometheus metrics for ``kode serve``, in the text exposition format (version 0.0.4).

Written by hand: a few counters, gauges and histograms need no client library.

    # HELP kode_generations_active Generations running on a backend now.
    # TYPE kode_generations_active gauge
    kode_generations_active 0
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

LATENCY_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

Labels = tuple[tuple[str, str], ...]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Labels, extra: tuple[str, str] | None = None) -> str:
    pairs = [*labels, extra] if extra is not None else list(labels)
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs) + "}"


def _number(value: float) -> str:
    if value == float("inf"):
        return "+Inf"
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


class Counter:
    """A monotonically increasing value per label set."""

    kind = "counter"

    def __init__(self, name: str, help_text: str, label_names: Sequence[str] = ()) -> None:
        self.name = name
        self.help = help_text
        self.label_names = tuple(label_names)
        self.values: dict[Labels, float] = {}
        if not self.label_names:
            self.values[()] = 0.0

    def _key(self, labels: Sequence[str]) -> Labels:
        if len(labels) != len(self.label_names):
            raise ValueError(f"{self.name} takes labels {self.label_names}")
        return tuple(zip(self.label_names, labels, strict=True))

    def inc(self, *labels: str, by: float = 1.0) -> None:
        key = self._key(labels)
        self.values[key] = self.values.get(key, 0.0) + by

    def get(self, *labels: str) -> float:
        return self.values.get(self._key(labels), 0.0)

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} {self.kind}"
        for key, value in sorted(self.values.items()):
            yield f"{self.name}{_labels(key)} {_number(value)}"


class Gauge(Counter):
    """A value that goes up and down."""

    kind = "gauge"

    def dec(self, *labels: str, by: float = 1.0) -> None:
        self.inc(*labels, by=-by)

    def set(self, *labels: str, to: float) -> None:
        self.values[self._key(labels)] = to


class Histogram:
    """Observations counted into cumulative ``le`` buckets, with their sum and count."""

    def __init__(self, name: str, help_text: str, buckets: Sequence[float]) -> None:
        self.name = name
        self.help = help_text
        self.bounds = tuple(sorted(buckets))
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} histogram"
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            yield f'{self.name}_bucket{{le="{_number(bound)}"}} {running}'
        yield f"{self.name}_sum {_number(self.sum)}"
        yield f"{self.name}_count {self.count}"


class Metrics:
    """Everything ``GET /metrics`` reports."""

    def __init__(self) -> None:
        self.requests = Counter(
            "kode_requests_total",
            "HTTP requests answered, by endpoint and status.",
            ("endpoint", "status"),
        )
        self.jobs_in_flight = Gauge(
            "kode_jobs_in_flight", "Accepted generation requests not yet ended (queued or running)."
        )
        self.active = Gauge("kode_generations_active", "Generations running on a backend now.")
        self.started = Counter("kode_generations_started_total", "Generations started.")
        self.finished = Counter(
            "kode_generations_finished_total", "Generations ended, by how.", ("reason",)
        )
        self.aborted = Counter(
            "kode_generations_aborted_total",
            "Requests aborted before they ended, by cause "
            "(superseded, client_abort, disconnect, shutdown).",
            ("cause",),
        )
        self.prompt_tokens = Counter("kode_prompt_tokens_total", "Prompt tokens of generations.")
        self.cached_tokens = Counter(
            "kode_cached_prompt_tokens_total", "Prompt tokens whose KV cache entries were reused."
        )
        self.completion_tokens = Counter("kode_completion_tokens_total", "Tokens generated.")
        self.aborted_tokens = Counter(
            "kode_aborted_completion_tokens_total",
            "Tokens generated for requests that were aborted before they ended (work thrown "
            "away; a generation that stops at once after its abort adds few).",
        )
        self.latency = Histogram(
            "kode_request_duration_seconds",
            "Request start to the end of a generation that finished (not aborted).",
            LATENCY_BUCKETS,
        )
        self.ttft = Histogram(
            "kode_time_to_first_token_seconds",
            "Request start to its first generated text.",
            LATENCY_BUCKETS,
        )

    def render(self, extra: Iterable[Counter] = ()) -> str:
        families: list[Counter | Histogram] = [
            self.requests,
            self.jobs_in_flight,
            self.active,
            self.started,
            self.finished,
            self.aborted,
            self.prompt_tokens,
            self.cached_tokens,
            self.completion_tokens,
            self.aborted_tokens,
            self.latency,
            self.ttft,
            *extra,
        ]
        return "\n".join(line for family in families for line in family.render()) + "\n"


def parse_text(text: str) -> dict[str, float]:
    """Samples of an exposition text, keyed by ``name{labels}`` as written (for tests, bench)."""
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        samples[name] = float(value)
    return samples
