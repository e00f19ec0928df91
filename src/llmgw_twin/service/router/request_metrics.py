"""What the forwarding counts and times: every inference request a controller or a router serves.

Role: each `forwarding.Forwarder` has one `RequestMetrics`. `Forwarder.forward` takes a
`RequestWatch` at a request's start and tells it how the request ended; the watch counts the
request (model, status code, outcome), times it into two histograms, and keeps the count in
flight. The forwarder's own counts (retries, failed attempts, cut streams) and the routing
core's ejections are read at scrape time. The service's registry (`metrics.py`) collects it.

Invariants:
- Labels are bounded. `model` is a deployed model's name, or "" for a request answered before
  its model was known to be deployed (a client's made-up name never becomes a series); `code`
  is the HTTP status the client got; `outcome` is `answered` (the replica's own answer, whatever
  its status), `cut` (a stream cut midway), `client_closed` (the client went away first) or the
  code of the forwarding's own error (`replies.openai_error`: `no_ready_replica`,
  `upstream_timeout`, ...), a fixed set of the forwarding's.
- Each watch ends once: the request counted once, its time observed at most once per histogram.
- Nothing here is on the heartbeat's way: a request costs a few dict updates and two
  histogram observations.
"""

from __future__ import annotations

import json
import time
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from fastapi.responses import Response
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.utils import floatToGoString

if TYPE_CHECKING:
    from llmgw_twin.service.router.forwarding import Forwarder

LATENCY_BUCKETS_S = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)
"""From a sim engine's few milliseconds to a long generation's minutes (the first byte may take
up to 120 s by default, `RouterTimeouts.first_byte_ms`)."""
CLIENT_CLOSED = 499
"""The status counted for a request whose client went away before its answer (nginx's)."""


RATE_BUCKET_S = 10
RATE_BUCKETS = 30
"""The recent request rate is counted over the last `RATE_BUCKETS` buckets of `RATE_BUCKET_S`
seconds (five minutes): what `llmgw-twin snapshot` writes as the fleet's traffic."""


class RecentRate:
    """Requests per model over the last five minutes, in ten-second buckets: a fixed ring per
    model, so its memory is bounded by the deployed models (labels are bounded, above)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._since = clock()
        self._rings: dict[str, list[int]] = {}
        self._slot: dict[str, int] = {}
        """model -> the absolute bucket number its ring's last write was in"""

    def _advance(self, model: str, now_slot: int) -> list[int]:
        ring = self._rings.setdefault(model, [0] * RATE_BUCKETS)
        last = self._slot.get(model, now_slot)
        for s in range(max(last + 1, now_slot - RATE_BUCKETS + 1), now_slot + 1):
            ring[s % RATE_BUCKETS] = 0
        self._slot[model] = now_slot
        return ring

    def count(self, model: str) -> None:
        if not model:
            return
        slot = int(self._clock() // RATE_BUCKET_S)
        ring = self._rings.get(model)
        if ring is None or self._slot[model] != slot:  # (else no bucket to clear)
            ring = self._advance(model, slot)
        ring[slot % RATE_BUCKETS] += 1

    def per_second(self) -> dict[str, float]:
        """Each model's requests per second over the window (or since the start, if shorter)."""
        now = self._clock()
        slot = int(now // RATE_BUCKET_S)
        span = min(float(RATE_BUCKET_S * RATE_BUCKETS), max(now - self._since, 1.0))
        out = {}
        for model in sorted(self._rings):
            n = sum(self._advance(model, slot))
            if n:
                out[model] = n / span
        return out


class Timings:
    """A latency histogram by model, exported as prometheus_client's `Histogram` exports one
    (`_bucket` by `le`, cumulative; `_count`, `_sum`, `_created`): an observation is one
    bisection and two additions, with no lock (the forwarding runs on one event loop) and no
    walk over the buckets; the cumulative counts are made at scrape time."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...]) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = buckets
        self._counts: dict[str, list[int]] = {}
        """model -> observations in each bucket alone (the last: over every bound)"""
        self._sums: dict[str, float] = {}
        self._created: dict[str, float] = {}

    def observe(self, model: str, seconds: float) -> None:
        counts = self._counts.get(model)
        if counts is None:
            counts = self._counts[model] = [0] * (len(self.bounds) + 1)
            self._sums[model] = 0.0
            self._created[model] = time.time()
        counts[bisect_left(self.bounds, seconds)] += 1  # `le`: the first bound >= seconds
        self._sums[model] += seconds

    def collect(self) -> Metric:
        metric = Metric(self.name, self.documentation, "histogram")
        les = [*(floatToGoString(b) for b in self.bounds), "+Inf"]  # type: ignore[no-untyped-call]
        for model in sorted(self._counts):
            acc = 0
            for le, n in zip(les, self._counts[model], strict=True):
                acc += n
                metric.add_sample(self.name + "_bucket", {"model": model, "le": le}, acc)
            metric.add_sample(self.name + "_count", {"model": model}, acc)
            metric.add_sample(self.name + "_sum", {"model": model}, self._sums[model])
            metric.add_sample(self.name + "_created", {"model": model}, self._created[model])
        return metric


class RequestMetrics:
    def __init__(self, forwarder: Forwarder) -> None:
        self._forwarder = forwarder
        self.recent = RecentRate()
        self.in_flight = 0
        self.requests: Counter[tuple[str, str, str]] = Counter()
        """(model, code, outcome) -> requests ended so far"""
        self.first_byte = Timings(
            "llmgw_request_first_byte_seconds",
            "From a request's arrival to the first byte of a replica's answer leaving for the "
            "client (a whole answer is read before any of it leaves)",
            LATENCY_BUCKETS_S,
        )
        self.duration = Timings(
            "llmgw_request_duration_seconds",
            "From a request's arrival to its answer's last byte, for requests sent to a replica "
            "(retries and failures included)",
            LATENCY_BUCKETS_S,
        )

    def watch(self) -> RequestWatch:
        return RequestWatch(self)

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "llmgw_requests",
            "Inference requests ended, by model, the status code the client got, and outcome",
            labels=["model", "code", "outcome"],
        )
        for (model, code, outcome), n in sorted(self.requests.items()):
            requests.add_metric([model, code, outcome], n)
        yield requests
        yield GaugeMetricFamily(
            "llmgw_requests_in_flight", "Inference requests being served", value=self.in_flight
        )
        yield self.first_byte.collect()
        yield self.duration.collect()
        f = self._forwarder
        yield CounterMetricFamily(
            "llmgw_request_retries",
            "Requests sent again to a second replica after the first failed",
            value=f.retried,
        )
        yield CounterMetricFamily(
            "llmgw_request_attempt_failures",
            "Attempts that failed before any byte of the answer was passed on",
            value=f.failed,
        )
        yield CounterMetricFamily(
            "llmgw_streams_cut", "Streamed answers cut after their first chunk", value=f.cut
        )
        yield CounterMetricFamily(
            "llmgw_replica_ejections",
            "Replicas taken out of routing for a while after failing requests in a row",
            value=f.router.ejections,
        )


class ReplicaAnswer:
    """Mixed into the forwarding's responses that are a replica's own answer (the others are
    the forwarding's own errors)."""

    streamed = False
    """A relayed stream: it calls `watch.stream_ended` once its last chunk is sent."""
    watch: RequestWatch | None = None


class RequestWatch:
    """One request, from its arrival to its end."""

    __slots__ = ("_metrics", "_open", "_start", "_status", "model")

    def __init__(self, metrics: RequestMetrics) -> None:
        metrics.in_flight += 1
        self._metrics = metrics
        self._start = time.perf_counter()
        self._status = 0
        self._open = True
        self.model = ""
        """Set once the request names a deployed model."""

    def answered(self, response: Response, tried: bool) -> None:
        """`response` leaves for the client now; `tried`: a replica was sent the request. A
        relayed stream ends later, with its last chunk (`stream_ended`)."""
        now = time.perf_counter()
        by_replica = isinstance(response, ReplicaAnswer)
        if by_replica:
            m = self._metrics
            m.first_byte.observe(self.model, now - self._start)
        if isinstance(response, ReplicaAnswer) and response.streamed:
            self._status = response.status_code
            response.watch = self
            return
        outcome = "answered" if by_replica else _error_code(response)
        self._end(response.status_code, outcome, tried, now)

    def stream_ended(self, cut: bool) -> None:
        self._end(self._status, "cut" if cut else "answered", True, time.perf_counter())

    def gone(self) -> None:
        """The request was cancelled: its client (or the server) went away."""
        self._end(CLIENT_CLOSED, "client_closed", False, time.perf_counter())

    def _end(self, status: int, outcome: str, timed: bool, now: float) -> None:
        if not self._open:
            return
        self._open = False
        m = self._metrics
        m.in_flight -= 1
        m.requests[(self.model, str(status), outcome)] += 1
        m.recent.count(self.model)
        if timed:
            m.duration.observe(self.model, now - self._start)


def _error_code(response: Response) -> str:
    """The `error.code` of the forwarding's own OpenAI-format error."""
    try:
        code = json.loads(bytes(response.body))["error"]["code"]
    except (ValueError, KeyError, TypeError, AttributeError):
        return "error"
    return code if isinstance(code, str) else "error"
