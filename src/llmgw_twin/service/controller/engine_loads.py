"""The engines' own load, for the controller's autoscaler: their queues and KV-cache use, read
from each replica leader's Prometheus `/metrics` (docs/autoscale.md).

Role: every `LoadLoop` interval, for each autoscaled model whose policy follows `queue` or
`kv_cache`, `EngineLoads.samples` asks every routable replica of the model (the controller's
`Router`) for its exposition, reads the metrics its engine's adapter names
(`engines.base.LoadMetrics`: no engine name is known here) and builds the model's `LoadSample`:
the queues of the replicas that answered summed, or their KV-cache use averaged (the mean taken
for every routable replica).

Invariants:
- Bounded: one replica is given `SCRAPE_TIMEOUT_S` and `MAX_BODY_BYTES`, at most
  `MAX_CONCURRENT` are asked at once, and a whole round ends by its deadline (the loop's
  interval); a replica past any bound is left out, as is one that answers no 200, an exposition
  that does not parse, or one that lacks the metric (or gives a share outside 0..1).
- No data, no sample: a model none of whose replicas answered gets no sample this round, so the
  autoscaler never acts on a reading it did not have; that is logged at most once a
  `WARN_EVERY_S` per model.
- A signal an engine does not export (llama.cpp's KV-cache use) is never asked of it: its
  replicas are skipped, logged once per model and engine (the config refuses such a policy when
  it can tell the engine, `config.py`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import httpx
from prometheus_client.parser import text_string_to_metric_families

from llmgw_twin.control.autoscale import AutoscalePolicy, LoadSample
from llmgw_twin.control.model import ModelName, ReplicaId
from llmgw_twin.control.routing import Route, Router
from llmgw_twin.engines.base import LoadMetrics
from llmgw_twin.engines.registry import adapter_for

log = logging.getLogger(__name__)

ENGINE_SIGNALS = ("queue", "kv_cache")
"""The signals read from the engines (the others are the controller's own)."""
SCRAPE_TIMEOUT_S = 1.0
MAX_CONCURRENT = 16
MAX_BODY_BYTES = 1 << 20
WARN_EVERY_S = 60.0
PRECISION = 1_000_000
"""A reading becomes a fraction with at most this denominator."""


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    queue: float | None
    """Requests waiting, summed over the series; None: not exported."""
    kv_cache: float | None
    """The share of the KV cache in use, the largest of the series; None: not exported."""


def read_load(text: str, metrics: LoadMetrics) -> ReplicaLoad:
    """The load one exposition says, by the names `metrics` lists (the first name present).
    ValueError when the lines of those metrics do not parse."""
    wanted = (*metrics.queue, *metrics.kv_cache)
    values: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(_lines_of(text, wanted)):
        for sample in family.samples:
            if sample.name in wanted and math.isfinite(sample.value):
                values.setdefault(sample.name, []).append(float(sample.value))
    queue = next((sum(values[n]) for n in metrics.queue if n in values), None)
    kv = next((max(values[n]) for n in metrics.kv_cache if n in values), None)
    return ReplicaLoad(
        queue if queue is not None and queue >= 0 else None,
        kv if kv is not None and 0 <= kv <= 1 else None,
    )


def _lines_of(text: str, names: Sequence[str]) -> str:
    """Only the lines about `names` (their samples, HELP and TYPE): an engine's exposition has
    hundreds of series the autoscaler never reads, and parsing them all would cost the loop."""
    keep = []
    for line in text.splitlines():
        body = line[7:] if line.startswith(("# HELP ", "# TYPE ")) else line
        for name in names:
            if body.startswith(name) and body[len(name) : len(name) + 1] in ("{", " ", "\t"):
                keep.append(line)
                break
    return "\n".join(keep) + "\n"


@dataclass(frozen=True, slots=True)
class _Ask:
    policy: AutoscalePolicy
    route: Route
    metrics: LoadMetrics


class EngineLoads:
    """The scraper; `samples` once a round. Its HTTP client opens on first use."""

    def __init__(
        self,
        router: Router,
        engine_of: Callable[[ReplicaId], str | None],
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout_s: float = SCRAPE_TIMEOUT_S,
        max_concurrent: int = MAX_CONCURRENT,
        max_body_bytes: int = MAX_BODY_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._router = router
        self._engine_of = engine_of
        """A replica's engine (its record's profile's, in the core); None: not known."""
        self._transport = transport
        self._timeout_s = timeout_s
        self._max_concurrent = max_concurrent
        self._max_body_bytes = max_body_bytes
        self._clock = clock
        self._client: httpx.AsyncClient | None = None
        self._warned_at: dict[ModelName, float] = {}
        self._unsupported: set[tuple[ModelName, str]] = set()

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def samples(
        self, policies: Sequence[AutoscalePolicy], deadline_s: float | None = None
    ) -> tuple[LoadSample, ...]:
        """A sample for each policy of an engine signal whose replicas answered, in order."""
        policies = [p for p in policies if p.signal in ENGINE_SIGNALS]
        if not policies:
            return ()
        asks = [ask for p in policies for ask in self._asks(p)]
        loads = await self._ask_all(asks, deadline_s)
        out = []
        for policy in policies:
            routes = self._router.routes(policy.model)
            read = [
                load
                for ask, load in zip(asks, loads, strict=True)
                if ask.policy is policy and load is not None
            ]
            values = [v for v in (getattr(r, policy.signal) for r in read) if v is not None]
            if not values:
                if any(ask.policy is policy for ask in asks):
                    self._warn(
                        policy.model, f"no replica of {len(routes)} said its {policy.signal}"
                    )
                continue
            value = sum(values) if policy.signal == "queue" else sum(values) / len(values)
            reading = Fraction(value).limit_denominator(PRECISION)
            out.append(LoadSample(policy.model, reading, len(routes)))
        return tuple(out)

    def _asks(self, policy: AutoscalePolicy) -> list[_Ask]:
        out = []
        for route in self._router.routes(policy.model):
            engine = self._engine_of(route.replica)
            if engine is None:
                continue
            try:
                metrics = adapter_for(engine).load_metrics
            except KeyError:
                metrics = LoadMetrics(queue=(), kv_cache=())
            if not getattr(metrics, policy.signal):
                if (policy.model, engine) not in self._unsupported:
                    self._unsupported.add((policy.model, engine))
                    log.warning(
                        "autoscale %s: engine %s exports no %s; its replicas are not read",
                        policy.model,
                        engine,
                        policy.signal,
                    )
                continue
            out.append(_Ask(policy, route, metrics))
        return out

    async def _ask_all(
        self, asks: Sequence[_Ask], deadline_s: float | None
    ) -> list[ReplicaLoad | None]:
        if not asks:
            return []
        if self._client is None:
            self._client = httpx.AsyncClient(
                transport=self._transport,
                trust_env=False,
                timeout=httpx.Timeout(self._timeout_s),
                limits=httpx.Limits(max_connections=self._max_concurrent),
            )
        gate = asyncio.Semaphore(self._max_concurrent)
        tasks = [asyncio.ensure_future(self._ask(self._client, gate, a)) for a in asks]
        _, late = await asyncio.wait(tasks, timeout=deadline_s)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        out: list[ReplicaLoad | None] = []
        for ask, task in zip(asks, tasks, strict=True):
            failed = None if task.cancelled() else task.exception()
            if failed is not None:
                log.warning("metrics of %s: %r", ask.route.replica, failed)
            out.append(None if task.cancelled() or failed is not None else task.result())
        return out

    async def _ask(
        self, client: httpx.AsyncClient, gate: asyncio.Semaphore, ask: _Ask
    ) -> ReplicaLoad | None:
        url = ask.route.endpoint.rstrip("/") + ask.metrics.path
        async with gate:
            try:
                async with asyncio.timeout(self._timeout_s):
                    text = await self._body(client, url)
            except (httpx.HTTPError, OSError, TimeoutError) as e:
                log.debug("metrics of %s at %s: %r", ask.route.replica, url, e)
                return None
        if text is None:
            return None
        try:
            return read_load(text, ask.metrics)
        except ValueError as e:
            log.debug("metrics of %s at %s do not parse: %s", ask.route.replica, url, e)
            return None

    async def _body(self, client: httpx.AsyncClient, url: str) -> str | None:
        async with client.stream("GET", url) as response:
            if response.status_code != 200:
                return None
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > self._max_body_bytes:
                    return None
        return body.decode("utf-8", "replace")

    def _warn(self, model: ModelName, what: str) -> None:
        now = self._clock()
        last = self._warned_at.get(model)
        if last is None or now - last >= WARN_EVERY_S:
            self._warned_at[model] = now
            log.warning("autoscale %s: %s; no sample this round", model, what)
