"""The router service's metrics (docs/metrics.md): its feed of the controller's events and
its routes, beside the forwarding's own (`request_metrics`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from fastapi.responses import Response
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from llmgw_twin.service.common.metrics import exposition, routable

if TYPE_CHECKING:
    from llmgw_twin.service.router.app import RouterRuntime


class RouterMetrics:
    def __init__(self, runtime: RouterRuntime) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_RouterCollector(runtime))
        self.registry.register(runtime.forwarder.metrics)

    def response(self) -> Response:
        return exposition(self.registry)


class _RouterCollector:
    def __init__(self, runtime: RouterRuntime) -> None:
        self._runtime = runtime

    def collect(self) -> Iterator[Metric]:
        rt = self._runtime
        follower = rt.follower
        yield GaugeMetricFamily(
            "llmgw_router_feed_connected",
            "1 while the router's last read of the controller's feed succeeded",
            value=int(follower.connected),
        )
        yield CounterMetricFamily(
            "llmgw_router_feed_resyncs",
            "Snapshots the router took (a new controller process, or it fell behind the log)",
            value=follower.resyncs,
        )
        yield CounterMetricFamily(
            "llmgw_router_feed_disconnects",
            "Reads of the feed that failed",
            value=follower.disconnects,
        )
        yield routable(rt.router, [*(follower.models or ()), *rt.router.models()])
