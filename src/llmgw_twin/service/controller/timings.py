"""Where the controller's time goes, as fixed-bucket histograms cheap enough for every
heartbeat: how long a heartbeat takes inside the controller, how late its event loop wakes,
and how long the collector pauses it (docs/metrics.md).

Role: a `Buckets` counts observations into fixed upper bounds (one `bisect` and two adds, no
lock: everything observes on the event loop's thread, or in the collector's callback, which
runs on that thread too). `/metrics` exports each as a Prometheus histogram, and the load
benchmark reads them before and after its steady window to say which side of the wire a
latency tail is on.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence

from prometheus_client.core import HistogramMetricFamily

SECONDS: tuple[float, ...] = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1.0,
    2.0,
    5.0,
)
"""Upper bounds (seconds): fine below 10 ms where a healthy heartbeat is, coarse above."""


class Buckets:
    def __init__(self, bounds: Sequence[float] = SECONDS) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        """Observations per bucket, not cumulative; the last is past every bound."""
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.total += seconds

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> Iterator[tuple[str, int]]:
        """(upper bound, observations at or under it), `+Inf` last, as Prometheus has them."""
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            yield ("+Inf" if bound == float("inf") else repr(bound)), running

    def family(self, name: str, documentation: str) -> HistogramMetricFamily:
        return HistogramMetricFamily(
            name, documentation, buckets=list(self.cumulative()), sum_value=self.total
        )


class ControllerTimings:
    """The controller's histograms, one object per runtime."""

    def __init__(self) -> None:
        self.heartbeat = Buckets()
        """A heartbeat answered the short way: from its request reaching the controller's app to
        its answer sent."""
        self.loop_lateness = Buckets()
        """How much later than asked each of the lag monitor's probes woke."""
        self.gc_pause: dict[int, Buckets] = {0: Buckets(), 1: Buckets(), 2: Buckets()}
        """The collector's pauses, by generation (the controller process's only)."""

    def families(self) -> Iterator[HistogramMetricFamily]:
        yield self.heartbeat.family(
            "llmgw_heartbeat_handling_seconds",
            "A heartbeat inside the controller: from its request reaching the app to its answer",
        )
        yield self.loop_lateness.family(
            "llmgw_controller_loop_lateness_seconds",
            "How much later than asked the controller's event loop woke its lag probe",
        )
        gc_family = HistogramMetricFamily(
            "llmgw_gc_pause_seconds",
            "The collector's pauses of the controller process, by generation",
            labels=["generation"],
        )
        for generation, b in sorted(self.gc_pause.items()):
            gc_family.add_metric([str(generation)], list(b.cumulative()), b.total)
        yield gc_family
