"""Traffic in the twin: clients' requests through a router process, judged against ground truth.

A scenario's `traffic` sends requests at a steady rate for the whole run. They go through a
router that runs beside the controller as its own process (as `llmgw-twin router` does): it
follows the controller's events, keeps its table while the controller is down, and takes a
restarted controller's snapshot (`control.routing.Router.resync`), using the same routing core as
the service. Every pick is checked by `routes_to_ready`.

A picked replica answers when every one of its engines is running, not hung, on a node that is
up, and its leader is reachable from the router over the management network. Otherwise the
attempt fails as a client would see it: a refused connection (the leader's process is gone, its
node up) at once, an unreachable or powered-off node after the connect timeout, a stalled
replica (a hung engine, a worker node powered off) after the first-byte timeout. A request that
was accepted fails when an engine of its replica stops or hangs before the answer is complete:
at once when the engine's connections closed (its process died, its node crashed, it was
stopped), at the first-byte timeout when the replica went silent (power off, a hang, a cut).
Answers are read whole before the client gets a byte (the router buffers a non-streamed answer),
so a failed first attempt is retried once on another replica. The outcome of every attempt goes
back to the routing core (passive ejection). An accepted attempt is `inflight.py`'s until it is
answered or fails.

Requests are counted by model and by arrival: sent, served, failed, and failed in flight (the
request was accepted by a replica that then died under it, and it still failed).

Requests arrive as `scenario/arrivals.py` says (the contract's even spacing, rate shapes, or a
trace). A replica whose profile the scenario names under `engine_model` answers through its
batch (`serving.py`): a request waits for the batch's answer instead of the fixed time, gives up
at the first-byte timeout (leaving the batch), and one too large for its cache fails at once. When
the scenario uses any of these additions, every served request's latency is recorded
(`latency.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from llmgw_twin.control.controller import Controller
from llmgw_twin.control.model import ModelName, ReplicaId, ReplicaState
from llmgw_twin.control.routing import Route, Router, RouterTimeouts
from llmgw_twin.control.routing_feed import snapshot_of
from llmgw_twin.twin.scenario.arrivals import Arrival, arrivals
from llmgw_twin.twin.scenario.model import Scenario, Traffic
from llmgw_twin.twin.scenario.workload_model import SloExpectation
from llmgw_twin.twin.world.checks import Invariants
from llmgw_twin.twin.world.inflight import FIRST_TOKEN_MS, TOKEN_MS, InFlight, Pending
from llmgw_twin.twin.world.latency import Latencies
from llmgw_twin.twin.world.reach import Answer, Engines, reach
from llmgw_twin.twin.world.serving import ModelServing
from llmgw_twin.twin.world.sim import World

__all__ = ["FIRST_TOKEN_MS", "HOLD_POLL_MS", "TOKEN_MS", "Counts", "TrafficRouter"]

HOLD_POLL_MS = 250
"""How often requests held for a model at zero replicas look for a replica."""


@dataclass(slots=True)
class Counts:
    """One model's requests."""

    arrivals: list[int] = field(default_factory=list)  # arrival time of each request, in order
    failed_at: list[int] = field(default_factory=list)  # arrival times of the failed ones
    in_flight: int = 0
    retried: int = 0
    no_replica: int = 0

    def as_dict(self, ejections: int) -> dict[str, int]:
        sent = len(self.arrivals)
        return {
            "sent": sent,
            "served": sent - len(self.failed_at),
            "failed": len(self.failed_at),
            "failed_in_flight": self.in_flight,
            "failed_no_replica": self.no_replica,
            "retried": self.retried,
            "ejections": ejections,
        }


class TrafficRouter:
    """The router process, the clients, and the requests' counts."""

    def __init__(
        self,
        scenario: Scenario,
        world: World,
        checks: Invariants,
        core: Callable[[], Controller],
        controller_up: Callable[[], bool],
    ) -> None:
        self.world = world
        self.checks = checks
        self._core = core
        self._up = controller_up
        self.timeouts = RouterTimeouts()
        self.router = Router()
        self.counts: dict[ModelName, Counts] = {t.model: Counts() for t in scenario.traffic}
        self._ejections: dict[ModelName, int] = dict.fromkeys(self.counts, 0)
        self._ready_when_down: frozenset[ReplicaId] = frozenset()
        self._end_ms = scenario.duration_ms
        self._zero_models = frozenset(p.model for p in scenario.autoscale if p.scale_to_zero)
        """Models that may scale to zero: a request finding no replica is held, not failed."""
        self._held: dict[ModelName, list[tuple[Traffic, Arrival, int]]] = {}
        perf = {m.profile: m.perf for m in scenario.engine_model}
        self.serving = ModelServing(world, perf) if perf else None
        opted_in = (
            bool(perf)
            or any(t.workload is not None for t in scenario.traffic)
            or any(isinstance(e, SloExpectation) for e in scenario.expectations)
        )
        self._slos = tuple(e for e in scenario.expectations if isinstance(e, SloExpectation))
        self.latencies: Latencies | None = Latencies() if opted_in else None
        """Every served request's times, when the scenario uses the workload additions."""
        self.inflight = InFlight(
            world,
            self.timeouts,
            self.serving,
            self.latencies,
            self._finished,
            self._failed,
            self._rejected,
        )
        """Requests a replica has accepted and not answered yet."""
        world.on_engine_stopped = self.inflight.engine_stopped
        # the traffic's own random streams, from the scenario's seed (as real mode's clients):
        # the world's stream is never drawn from, so traffic changes no other draw
        seed = f"{scenario.seed}"
        for traffic in scenario.traffic:
            self._next(traffic, arrivals(traffic, self._end_ms, seed))

    # --- following the controller --------------------------------------------------------------

    def controller_died(self, core: Controller) -> None:
        """The router keeps its table; what it may still pick is what a controller called ready
        last (judged by `routes_to_ready` until a new controller speaks of it)."""
        self._ready_when_down = frozenset(
            r.id
            for r in core.replicas()
            if r.state is ReplicaState.READY
            # restored after an earlier outage and not judged since: still that word
            or (r.state is ReplicaState.ADOPTING and r.id in self._ready_when_down)
        )

    def controller_deposed(self) -> None:
        """A leader stepped down, perhaps with decisions in its memory it never published: what
        the router may still pick is what it was told was routable (its own table)."""
        self._ready_when_down = self.router.routed()  # (a role group's prefill replicas too)

    def controller_started(self, core: Controller) -> None:
        self.router.resync(snapshot_of(core.replicas()))

    # --- clients -------------------------------------------------------------------------------

    def _next(self, traffic: Traffic, upcoming: Iterator[Arrival]) -> None:
        req = next(upcoming, None)
        if req is None:
            return

        def arrive() -> None:
            self._next(traffic, upcoming)
            self._request(traffic, req)

        self.world.later(req.at_ms - self.world.now, arrive)

    def held(self, model: ModelName) -> int:
        """Requests waiting for a replica of a model scaled to zero."""
        return len(self._held.get(model, ()))

    def _hold(self, traffic: Traffic, req: Arrival) -> None:
        """A request to a model that may scale to zero and has no replica: held, as a scale-
        from-zero proxy holds it, until a replica serves or the router's first-byte timeout
        passes (then it fails as one with no replica would)."""
        held = self._held.setdefault(traffic.model, [])
        held.append((traffic, req, self.world.now + self.timeouts.first_byte_ms))
        if len(held) == 1:  # one poll per model while any is held
            self.world.later(HOLD_POLL_MS, lambda: self._release(traffic.model))

    def _release(self, model: ModelName) -> None:
        """The held requests go once the model has a routable replica (tried as any request
        is: one the router then cannot pick fails, it is not held again), or fail at their
        deadline; the rest wait for the next poll."""
        held, waiting = self._held.pop(model, []), []
        now = self.world.now
        routable = bool(self.router.routes(model))
        for traffic, req, deadline in held:
            if routable:
                self._attempt(traffic, req, first=None, died=False)
            elif now >= deadline:
                counts = self.counts[model]
                counts.failed_at.append(req.at_ms)
                counts.no_replica += 1
            else:
                waiting.append((traffic, req, deadline))
        if waiting:
            self._held[model] = waiting
            self.world.later(HOLD_POLL_MS, lambda: self._release(model))

    def _request(self, traffic: Traffic, req: Arrival) -> None:
        counts = self.counts[traffic.model]
        counts.arrivals.append(req.at_ms)
        self._attempt(traffic, req, first=None, died=False)

    def _attempt(self, traffic: Traffic, req: Arrival, first: ReplicaId | None, died: bool) -> None:
        """One try of a request; `first` is the replica a retry must avoid, `died` whether the
        request was on a replica that died under it."""
        counts = self.counts[traffic.model]
        now = self.world.now
        exclude = () if first is None else (first,)
        route = self.router.pick(traffic.model, now, exclude)
        if route is None:
            if (
                first is None
                and not died
                and traffic.model in self._zero_models
                and not self.router.routes(traffic.model)
            ):
                self._hold(traffic, req)  # scaled to zero: wait for a replica to load
                return
            counts.failed_at.append(req.at_ms)
            counts.no_replica += 1
            counts.in_flight += died
            return
        self._judge_pick(route.replica, now)
        retry = first is None
        if route.prefill is not None and not self._prefilled(traffic, req, route, retry, died):
            return
        engines, answer = self._reach(route.replica)
        if answer is not Answer.OK:
            self._fail_later(answer, lambda: self._failed(traffic, req, route.replica, retry, died))
            return
        pending = Pending(traffic, req, route.replica, retry)
        self.inflight.add(pending)
        rec = self._core().replica(route.replica)
        if self.serving is not None and rec is not None and self.serving.serves(rec.profile.name):
            self.inflight.batched(pending, engines, rec.profile.name, died)
            return
        self.inflight.fixed(pending, engines)

    def _prefilled(
        self, traffic: Traffic, req: Arrival, route: Route, retry: bool, died: bool
    ) -> bool:
        """A role group's prefill replica takes the prompt first: whether it did (its pick is
        told at once), else the try fails as a try on it would."""
        assert route.prefill is not None
        hop = route.prefill.replica
        self._judge_pick(hop, self.world.now)
        _, answer = self._reach(hop)
        if answer is Answer.OK:
            self._finished(traffic.model, hop, True)
            return True
        self._finished(traffic.model, route.replica, True)  # (never tried)
        self._fail_later(answer, lambda: self._failed(traffic, req, hop, retry, died))
        return False

    def _fail_later(self, answer: Answer, failed: Callable[[], None]) -> None:
        """A try that found its replica refusing, unreachable or stalled fails when the client
        would know."""
        delay = {
            Answer.REFUSED: 0,
            Answer.UNREACHABLE: self.timeouts.connect_ms,
            Answer.STALLED: self.timeouts.first_byte_ms,
        }[answer]
        self.world.later(delay, failed)

    def _failed(
        self,
        traffic: Traffic,
        req: Arrival,
        rid: ReplicaId,
        retry: bool,
        died: bool,
    ) -> None:
        self._finished(traffic.model, rid, False)
        counts = self.counts[traffic.model]
        if retry:
            counts.retried += 1
            self._attempt(traffic, req, first=rid, died=died)
            return
        counts.failed_at.append(req.at_ms)
        counts.in_flight += died

    def _rejected(self, traffic: Traffic, req: Arrival, died: bool) -> None:
        """A request its engine refused (too large for its cache): failed, not retried."""
        counts = self.counts[traffic.model]
        counts.failed_at.append(req.at_ms)
        counts.in_flight += died

    def _finished(self, model: ModelName, rid: ReplicaId, ok: bool) -> None:
        if self.router.finished(rid, ok, self.world.now):
            self._ejections[model] += 1

    # --- ground truth --------------------------------------------------------------------------

    def _judge_pick(self, rid: ReplicaId, now: int) -> None:
        """`routes_to_ready` for this router: the replica is ready by the controller's word, or
        by the last word of a controller that died (down, or restarted and not judging it yet,
        while no node of it is silent: a silent node takes any replica out of routing)."""
        core = self._core()
        rec = core.replica(rid)
        if rid in self._ready_when_down and (
            not self._up()
            or (rec is not None and rec.state is ReplicaState.ADOPTING and not rec.unroutable)
        ):
            self.checks.checks["routes_to_ready"] += 1
            return
        self.checks.routed(core, now, rid)

    def _reach(self, rid: ReplicaId) -> tuple[Engines, Answer]:
        return reach(self.world, self._core().replica(rid))

    # --- the report ----------------------------------------------------------------------------

    def report(self) -> dict[str, dict[str, int]]:
        return {m: c.as_dict(self._ejections[m]) for m, c in sorted(self.counts.items())}

    def latency_report(self) -> dict[str, dict[str, object]] | None:
        if self.latencies is None:
            return None
        arrivals = {m: c.arrivals for m, c in self.counts.items()}
        return self.latencies.report(arrivals, self._end_ms, self._slos)
