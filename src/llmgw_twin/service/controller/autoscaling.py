"""The controller service's autoscaling: the load it hears, and the loop that reports it to the
core (`control/autoscale.py`, docs/autoscale.md).

Role: each router process pushes the requests outstanding at its replicas, per model, every few
seconds (`POST /v1/router/load`, `RouterLoads.put`); the controller's own forwarding counts
its own. Every policy's `interval` (the shortest of them), `LoadLoop` sums them per model whose
policy follows `outstanding`, with the model's routable replicas as the controller's router
sees them, reads the engines' queues or KV-cache use for the models whose policy follows
`queue` or `kv_cache` (`engine_loads.py`), and hands the core one `LoadReport`; what the core
decides is applied as any step is (a `deployment.scaled` event, the deployment's new count in
the store).

Invariants:
- A router's push counts while it is fresh (`STALE_S`); one that stopped pushing (gone, cut
  off) stops counting, so a dead router's last load never holds a count up.
- At most `MAX_ROUTERS` routers are remembered (the oldest push is dropped first): memory an
  authenticated caller cannot grow without bound.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import replace
from fractions import Fraction
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from llmgw_twin.control.autoscale import AutoscalePolicy, LoadSample
from llmgw_twin.control.model import ModelName
from llmgw_twin.control.protocol import LoadReport
from llmgw_twin.control.routing import Router
from llmgw_twin.service.controller.engine_loads import EngineLoads

log = logging.getLogger(__name__)

STALE_S = 30.0
"""A router's push older than this no longer counts."""
MAX_ROUTERS = 1_000
MAX_MODELS = 1_000


PerModel = Annotated[
    dict[Annotated[str, StringConstraints(max_length=128)], Annotated[int, Field(ge=0)]],
    Field(max_length=MAX_MODELS),
]
"""A count per model name, as a router pushes them."""


class LoadPushW(BaseModel):
    """A router's push: its id (any string it keeps for its life) and, per model, the requests
    outstanding at the model's replicas."""

    model_config = ConfigDict(extra="forbid")
    router: Annotated[str, StringConstraints(min_length=1, max_length=128)]
    outstanding: PerModel
    held: PerModel = {}
    """Requests the router holds for a model scaled to zero (`router/holding.py`)."""


class RouterLoads:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._loads: dict[str, tuple[float, dict[str, int], dict[str, int]]] = {}

    def put(
        self, router: str, outstanding: dict[str, int], held: dict[str, int] | None = None
    ) -> None:
        self._loads.pop(router, None)  # re-inserted last: the dict is oldest-push first
        self._loads[router] = (self._clock(), dict(outstanding), dict(held or {}))
        while len(self._loads) > MAX_ROUTERS:
            del self._loads[next(iter(self._loads))]

    def _fresh(self) -> list[tuple[dict[str, int], dict[str, int]]]:
        """Each router's outstanding and held counts, of the pushes that still count."""
        now = self._clock()
        return [(load, held) for at, load, held in self._loads.values() if now - at <= STALE_S]

    def outstanding(self, model: str) -> int:
        return sum(load.get(model, 0) for load, _ in self._fresh())

    def held(self, model: str) -> int:
        return sum(held.get(model, 0) for _, held in self._fresh())

    def routers(self) -> int:
        return len(self._fresh())


def samples(
    policies: tuple[AutoscalePolicy, ...], router: Router, loads: RouterLoads
) -> tuple[LoadSample, ...]:
    """The load now of each model whose policy follows `outstanding`: its routable replicas
    (the controller's own table) and the requests outstanding at them (its own forwarding's and
    every fresh router's)."""
    out = []
    for policy in policies:
        if policy.signal != "outstanding":
            continue
        routes = router.routes(policy.model)
        own = sum(router.outstanding(r.replica) for r in routes)
        total = own + loads.outstanding(str(policy.model))
        out.append(LoadSample(ModelName(policy.model), Fraction(total), len(routes)))
    return tuple(out)


class LoadLoop:
    """Every `interval`, the load to the core (`handle` awaits the step's commit). The engines'
    signals come from `engines`; without it, only `outstanding` policies are reported."""

    def __init__(
        self,
        policies: tuple[AutoscalePolicy, ...],
        router: Router,
        loads: RouterLoads,
        handle: Callable[[LoadReport], Awaitable[None]],
        engines: EngineLoads | None = None,
        own_held: Callable[[ModelName], int] = lambda _model: 0,
    ) -> None:
        self.policies = policies
        self._router = router
        self._loads = loads
        self._handle = handle
        self._engines = engines
        self._own_held = own_held
        """Requests the controller's own forwarding holds for a model at zero."""
        self._soon = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def holding(self) -> list[str]:
        """The models whose requests are held while none of their replicas is routable."""
        return sorted(str(p.model) for p in self.policies if p.scale_to_zero)

    def poke(self, _model: object = None) -> None:
        """Report at once, not at the next interval: a request is held for a model at zero."""
        self._soon.set()

    def start(self) -> None:
        if self.policies:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._engines is not None:
            await self._engines.aclose()

    async def report(self, deadline_s: float | None = None) -> LoadReport:
        """The load now: the `outstanding` samples, then the engines' (a model whose replicas
        did not answer by `deadline_s` has none)."""
        engines = (
            () if self._engines is None else await self._engines.samples(self.policies, deadline_s)
        )
        found = samples(self.policies, self._router, self._loads) + engines
        return LoadReport(self._with_held(found))

    def _with_held(self, found: tuple[LoadSample, ...]) -> tuple[LoadSample, ...]:
        """Each sample with the requests held for its model (the controller's and every fresh
        router's); a model at zero with requests held has a sample even when its signal has
        none (no replica to read an engine's queue from)."""
        by_model = {s.model: s for s in found}
        for policy in self.policies:
            if not policy.scale_to_zero:
                continue
            model = ModelName(policy.model)
            held = self._own_held(model) + self._loads.held(str(model))
            if held == 0:
                continue
            sample = by_model.get(model)
            if sample is None:
                serving = len(self._router.routes(model))
                by_model[model] = LoadSample(model, Fraction(0), serving, held)
            else:
                by_model[model] = replace(sample, held=held)
        return tuple(by_model.values())

    async def _run(self) -> None:
        interval_s = min(p.interval_ms for p in self.policies) / 1000
        while True:
            with suppress(TimeoutError):
                await asyncio.wait_for(self._soon.wait(), interval_s)
            self._soon.clear()
            try:
                report = await self.report(deadline_s=interval_s)
                if report.samples:
                    await self._handle(report)
            except Exception:  # a refused step (deposed, store down): the next report comes
                log.exception("the autoscaler's load report was not taken")
