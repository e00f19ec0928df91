"""The controller runtime's reads (`ControllerRuntime` inherits them): the fleet's state, the
event log, the deployed models, and the routing feed and inference forwarding they serve.

Role: behind `GET /v1/admin/state`, `GET /v1/admin/events`, `GET /v1/models`, the inference
routes and `GET /v1/router/feed` (`routes.py`; docs/services.md). Nothing here changes the
core's state: a read takes what the runtime holds now.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import Response

from llmgw_twin.control.controller import Controller
from llmgw_twin.control.model import NodeId, TraceEvent
from llmgw_twin.control.routing import Router
from llmgw_twin.control.routing_feed import snapshot_of
from llmgw_twin.service.common.auth import ControllerKeys
from llmgw_twin.service.common.feed import RoutingFeed
from llmgw_twin.service.common.views import fleet_state, model_list
from llmgw_twin.service.common.wire import TraceEventW
from llmgw_twin.store.base import SqlStore

if TYPE_CHECKING:
    from llmgw_twin.service.controller.config import ControllerSettings
    from llmgw_twin.service.controller.delivery import Delivery
    from llmgw_twin.service.controller.gcpauses import GcPauses
    from llmgw_twin.service.controller.lag import LagMonitor
    from llmgw_twin.service.controller.leadership import Leadership
    from llmgw_twin.service.router.forwarding import Forwarder

EVENTS_PAGE = 5_000
"""The most events one read of the log returns: a reader follows `next`."""


class ReadCalls:
    """What the runtime gives these reads is declared here (set in its `__init__`)."""

    settings: ControllerSettings
    store: SqlStore
    keys: ControllerKeys | None
    router: Router
    feed: RoutingFeed
    forwarder: Forwarder
    delivery: Delivery
    leadership: Leadership
    lag: LagMonitor
    gc_pauses: GcPauses | None
    _agent_urls: dict[NodeId, str]
    _events: list[TraceEvent]
    _events_dropped: int
    _t0_ns: int
    _epoch0_ms: int

    def now_ms(self) -> int:
        raise NotImplementedError

    @property
    def core(self) -> Controller:
        raise NotImplementedError

    def state(self) -> dict[str, Any]:
        out = fleet_state(self.core, self._agent_urls, self.now_ms())
        gc_view = self.gc_pauses.view() if self.gc_pauses is not None else {}
        out["controller"] = (
            self.lag.view()
            | gc_view
            | {
                "sent": self.delivery.sent,
                "send_failures": self.delivery.failed,
                "sends_given_up": self.delivery.dropped,
                "sends_queued": self.delivery.in_flight,
                "next_reconcile_ms": self.core.reconcile_due_ms,
            }
        )
        # the requests this controller served itself, per second by model over five minutes
        out["request_rates"] = self.forwarder.metrics.recent.per_second()
        lease = self.store.lease()
        store_now = self.store.now_ms()
        out["leadership"] = {
            "name": self.leadership.name,
            "epoch": self.leadership.epoch,
            "lease_expires_ms": lease.expires_ms if lease is not None else None,
            "url": self.leadership.url or None,
            # the others that said within a lease where they are reached: standbys, alive
            "standbys": [
                {"name": p.name, "url": p.url, "seen_ms_ago": store_now - p.seen_ms}
                for p in self.leadership.peers()
                if p.name != self.leadership.name
                and store_now - p.seen_ms <= self.settings.timings.lease_ms
            ],
        }
        if self.keys is not None:
            out["credentials"] = [
                {"node": c.node, "agent_url": c.agent_url, "issued_ms": c.issued_ms}
                for c in self.keys.nodes()
            ]
        return out

    def events(self, after: int, limit: int = EVENTS_PAGE) -> dict[str, Any]:
        """Events `after`.. of the log, at most `limit` of them: follow `next` for the rest."""
        start = max(after - self._events_dropped, 0)
        page = self._events[start : start + limit]
        return {
            "events": [TraceEventW.from_core(ev).model_dump(mode="json") for ev in page],
            "next": self._events_dropped + start + len(page),
            "dropped": max(self._events_dropped - after, 0),
            # the host's monotonic clock at t_ms 0: lets a harness on the same host put events
            # of successive controller processes on one time line
            "origin_monotonic_ns": self._t0_ns - self._epoch0_ms * 1_000_000,
        }

    def deployed(self) -> list[str]:
        return [d.model for d in self.core.deployments()]

    def models(self) -> dict[str, Any]:
        return model_list(self.deployed(), self.router)

    async def proxy(self, request: Request, path: str) -> Response:
        return await self.forwarder.forward(request, path, self.deployed)

    async def router_feed(self, after: int, epoch: str | None, wait_ms: int) -> dict[str, Any]:
        """A page of the routing feed (`feed.py`) for a router process."""
        return await self.feed.read(
            after, epoch, wait_ms, lambda: snapshot_of(self.core.replicas()), self.deployed
        )
