"""What `GET /metrics` of the controller and of the router share (docs/metrics.md): the route,
Prometheus's text format, and the builders of metric families their collectors yield.

Each runtime has one metrics object with a registry of its own (never the process's default one,
so that runtimes in one process keep apart): `controller.metrics.ControllerMetrics` and
`router.metrics.RouterMetrics`. Both collect the forwarding's own (`router.request_metrics`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from llmgw_twin.control.model import ModelName
from llmgw_twin.control.routing import Router
from llmgw_twin.service.common.openapi import TEXT_ERRORS


class Scraped(Protocol):
    """A runtime's metrics: its registry's exposition."""

    def response(self) -> Response: ...


def exposition(registry: CollectorRegistry) -> Response:
    """The registry's metrics, as Prometheus's text format 0.0.4 (every Prometheus reads it)."""
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_PLAIN_0_0_4)


def add_metrics_route(app: FastAPI, metrics: Scraped, dependencies: Sequence[Any]) -> None:
    """`GET /metrics` on `app`, asking for what `dependencies` ask (docs/metrics.md). It runs on
    the event loop, so a scrape reads the runtime between two of its steps."""

    @app.get(
        "/metrics",
        dependencies=list(dependencies),
        response_class=PlainTextResponse,
        summary="Metrics in Prometheus's text format",
        responses=TEXT_ERRORS,  # its refusals are text too (`openapi.TEXT_PATHS`)
    )
    async def scrape() -> Response:
        return metrics.response()


def counter(
    name: str, doc: str, labels: list[str], rows: Iterable[tuple[tuple[str, ...], int]]
) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=labels)
    for values, n in sorted(rows):
        family.add_metric(list(values), n)
    return family


def gauge(
    name: str, doc: str, labels: list[str], rows: Iterable[tuple[tuple[str, ...], float]]
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=labels)
    for values, n in rows:
        family.add_metric(list(values), n)
    return family


def routable(router: Router, models: Iterable[str]) -> GaugeMetricFamily:
    return gauge(
        "llmgw_routable_replicas",
        "Replicas of the model this process may route to (ejected ones included)",
        ["model"],
        (((m,), len(router.routes(ModelName(m)))) for m in sorted(set(models))),
    )
