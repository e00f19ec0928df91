"""The sim engine's Prometheus `/metrics`: its queue and KV-cache use, as a real engine's.

The controller's autoscaler reads them as it reads vLLM's or SGLang's (`engines/sim.py` names
them): `llmgw_sim:requests_waiting`, the requests waiting for a batch slot or KV cache, and
`llmgw_sim:kv_cache_usage_ratio`, the share of the KV cache in use (0 to 1), both labelled
`model_name`. They come from the engine model the shard runs (`--perf-model`, `sim_batcher`),
read at the moment of the scrape; a shard without one waits for nothing and holds no cache, so
both are 0.
"""

from __future__ import annotations

from collections.abc import Iterator

from fastapi import FastAPI, Response
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from llmgw_twin.engines.sim import KV_CACHE_METRIC, QUEUE_METRIC
from llmgw_twin.programs.sim_batcher import Batcher

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _Load(Collector):
    def __init__(self, served_name: str, batcher: Batcher | None) -> None:
        self._served_name = served_name
        self._batcher = batcher

    def collect(self) -> Iterator[Metric]:
        waiting, usage = (0, 0.0) if self._batcher is None else self._batcher.load()
        queue = GaugeMetricFamily(
            QUEUE_METRIC,
            "Requests waiting for a batch slot or KV cache.",
            labels=("model_name",),
        )
        queue.add_metric((self._served_name,), waiting)
        kv = GaugeMetricFamily(
            KV_CACHE_METRIC,
            "The share of the KV cache in use (0 to 1).",
            labels=("model_name",),
        )
        kv.add_metric((self._served_name,), usage)
        yield queue
        yield kv


def exposition(served_name: str, batcher: Batcher | None) -> bytes:
    """The text of one scrape, now."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Load(served_name, batcher))
    return generate_latest(registry)


def add_metrics(app: FastAPI, served_name: str, batcher: Batcher | None) -> None:
    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(exposition(served_name, batcher), media_type=CONTENT_TYPE)
