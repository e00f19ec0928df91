"""The leader's routing probe: at each reconcile, one request's pick per model, judged.

`Probe` holds a router of the controller's own (not the clients', `traffic.py`), following the
last leader's events; after each reconcile of that leader it picks a replica of each deployed
model and the checker judges the pick (`routes_to_ready`), then the request is done at once.

Invariant: nothing a probe judges (what the router holds, what the controller thinks of each
replica) changes but by an event of the leader. The picks go round the replicas a model
routes (least outstanding, then least recently picked), so once each has been picked since
the last event, another probe could find nothing new: the probes of that model stop until the
next event (a quiet fleet's day probed 950 replicas at each of 8,640 reconciles). A role
group's model is probed every time (its prefill replicas go round per group, not with it).
"""

from __future__ import annotations

from collections.abc import Iterable

from llmgw_twin.control.controller import Controller
from llmgw_twin.control.model import ModelName, TraceEvent
from llmgw_twin.control.routing import Router
from llmgw_twin.twin.world.checks import Invariants


class Probe:
    def __init__(self, models: Iterable[ModelName], checks: Invariants) -> None:
        self.models = list(models)
        self.checks = checks
        self.router = Router()
        self._probed: dict[ModelName, int] = {}
        """Picks of each model since the leader's last event."""

    def reset(self) -> None:
        """A new leader: a new router, following it from its start."""
        self.router = Router()
        self._probed.clear()

    def follow(self, event: TraceEvent) -> None:
        self._probed.clear()  # whatever it says, the probes judge anew
        self.router.follow(event)

    def run(self, core: Controller, now: int) -> None:
        router = self.router
        for model in self.models:
            probed = self._probed.get(model, 0)
            if probed and probed >= router.size(model) and not router.grouped(model):
                continue
            self._probed[model] = probed + 1
            route = router.pick(model, now)
            if route is None:
                continue
            self.checks.routed(core, now, route.replica)
            router.finished(route.replica, True, now)
            if route.prefill is not None:
                self.checks.routed(core, now, route.prefill.replica)
                router.finished(route.prefill.replica, True, now)
