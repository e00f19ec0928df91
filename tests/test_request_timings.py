"""The forwarding's latency histograms (`request_metrics.Timings`) are exported exactly as
prometheus_client's own `Histogram` exports the same observations: bucket by bucket (a value
on a bound counts in that bound's bucket), count, sum, and a `_created` time per model;
with nothing observed, the family alone."""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import Metric

from llmgw_twin.service.router.request_metrics import LATENCY_BUCKETS_S, Timings


class _Collector:
    def __init__(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self.collect = collect


def _exposed(collect: Callable[[], Iterable[Metric]]) -> bytes:
    registry = CollectorRegistry()
    registry.register(_Collector(collect))
    # each `_created` is the instant its series began: not the same instant both ways
    return re.sub(rb"(_created\{[^}]*\}) \S+", rb"\1 T", generate_latest(registry))


def test_timings_export_what_a_prometheus_histogram_exports() -> None:
    theirs = Histogram("t_seconds", "doc", ["model"], buckets=LATENCY_BUCKETS_S, registry=None)
    ours = Timings("t_seconds", "doc", LATENCY_BUCKETS_S)
    assert _exposed(lambda: [ours.collect()]) == _exposed(theirs.collect)
    rnd = random.Random(7)
    values = [0.0, *LATENCY_BUCKETS_S, *(rnd.uniform(0, 400) for _ in range(500))]
    for i, seconds in enumerate(values):
        model = ("chat", "code", "embed")[i % 3]
        theirs.labels(model).observe(seconds)
        ours.observe(model, seconds)
    exposed = _exposed(lambda: [ours.collect()])
    assert exposed == _exposed(theirs.collect)
    assert b't_seconds_bucket{le="+Inf",model="chat"} 172.0' in exposed
    assert b't_seconds_created{model="embed"} T' in exposed
