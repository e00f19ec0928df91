"""The controller service: the controller core behind FastAPI, its store, its loop, its router.

Role: the production twin of `twin/world/controller.py`. `ControllerRuntime` owns the core
`Controller`, the SQLite `Store`, the router (with its forwarding, `forwarding.py`), the
routing feed that router processes follow (`feed.py`) and two HTTP clients; it moves messages
only: agents' registrations and heartbeats and the operator's profiles and deployments go into
the core, and the core's commands go out to the agents. Its HTTP face is
`routes.create_controller_app`; the calls behind it are inherited: the agents' (`agent_calls.py`),
the admin's (`admin_calls.py`) and the reads (`reads.py`).

Invariants:
- Every call into the core holds one asyncio lock, and carrying out its `Step` never awaits:
  each step's writes and events are committed to the store (one transaction) before any of its
  commands is sent, its events reach the router, the event log and the routing feed in order
  (the log's numbers go on from the store's across restarts), and its
  `wake_at_ms` arms the reconcile loop. Time is integer ms on a monotonic clock, counted from
  the runtime's creation.
- Commands go out through `delivery.Delivery`: to one node in the order they were decided, an
  assignment a newer one superseded not sent, a failed send logged and dropped (the core is
  level-triggered and assigns again once the agent's report disagrees).
- A failed store commit, or an exception inside the core (other than its refusals, which change
  nothing), stops the process (`EXIT_FATAL`) before anything of that step leaves it: the
  core's memory may be ahead of its store, and adoption after a restart is the way back.
- A heartbeat from a node the core does not know is answered in-band (`report: true`): the
  agent registers at once, even when no address for it is known.
- On start the runtime restores from its store when the store holds anything; otherwise it
  starts empty and applies the config's profiles and deployments.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pathlib
import time
from collections.abc import Callable
from contextlib import suppress
from typing import NoReturn

import httpx

from llmgw_twin.control.apply import apply_step
from llmgw_twin.control.controller import Controller
from llmgw_twin.control.durable import DurableState, Write
from llmgw_twin.control.model import NodeId, TraceEvent
from llmgw_twin.control.protocol import (
    ApplyAutoscale,
    ApplyDeployment,
    ApplyProfile,
    ControllerCommand,
    ControllerEvent,
    ControllerLagged,
    RequestReport,
    Step,
)
from llmgw_twin.control.routing import Router
from llmgw_twin.service.common.auth import (
    ControllerKeys,
    NodeCredential,
    load_secret,
)
from llmgw_twin.service.common.feed import RoutingFeed
from llmgw_twin.service.common.wire import Refused
from llmgw_twin.service.controller.admin_calls import AdminCalls
from llmgw_twin.service.controller.agent_calls import AgentCalls
from llmgw_twin.service.controller.autoscaling import LoadLoop, RouterLoads
from llmgw_twin.service.controller.committer import Committer
from llmgw_twin.service.controller.config import ControllerSettings
from llmgw_twin.service.controller.delivery import Delivery
from llmgw_twin.service.controller.engine_loads import EngineLoads
from llmgw_twin.service.controller.gcpauses import GcPauses
from llmgw_twin.service.controller.lag import LagMonitor
from llmgw_twin.service.controller.leadership import Leadership
from llmgw_twin.service.controller.metrics import ControllerMetrics
from llmgw_twin.service.controller.reads import ReadCalls
from llmgw_twin.service.controller.timings import ControllerTimings
from llmgw_twin.service.router.forwarding import Forwarder
from llmgw_twin.store.choose import open_store
from llmgw_twin.store.postgres import is_postgres_url

log = logging.getLogger("llmgw_twin.controller")

EXIT_FATAL = 70
"""The controller process's exit status after a failed store commit or a fault in the core."""


def _die(message: str) -> NoReturn:
    """Stop the process at once: its memory may be ahead of its store, and nothing more may be
    sent from it. The next process starts from the store and adopts what the agents run."""
    log.critical("%s: stopping the controller (exit %d); restart it to adopt", message, EXIT_FATAL)
    logging.shutdown()
    os._exit(EXIT_FATAL)


class ControllerRuntime(AdminCalls, AgentCalls, ReadCalls):
    def __init__(
        self,
        settings: ControllerSettings,
        *,
        agent_transport: httpx.AsyncBaseTransport | None = None,
        engine_transport: httpx.AsyncBaseTransport | None = None,
        fatal: Callable[[str], None] = _die,
    ) -> None:
        """`fatal` is called, with the lock held, when a commit or a core call fails; it must
        not return into the step (the default ends the process; tests raise)."""
        self.settings = settings
        self._fatal = fatal
        self._t0_ns = time.monotonic_ns()
        # the core's clock: wall-clock ms at start, then monotonic, so times the store keeps
        # (silence, quarantines) mean the same to the next controller process
        self._epoch0_ms = time.time_ns() // 1_000_000
        if settings.store != ":memory:" and not is_postgres_url(settings.store):
            pathlib.Path(settings.store).parent.mkdir(parents=True, exist_ok=True)
        self.store = open_store(settings.store, events_kept=settings.events_kept)
        self.router = Router(outstanding_limit=settings.limits.outstanding_per_replica)
        self.forwarder = Forwarder(self.router, transport=engine_transport)
        self.router_loads = RouterLoads()
        """The routers' pushed load, for the autoscaler (`autoscaling.py`)."""
        self.load_loop = LoadLoop(
            settings.autoscale,
            self.router,
            self.router_loads,
            lambda report: self.handle_all([report]),
            EngineLoads(
                self.router,
                lambda rid: None if (r := self.core.replica(rid)) is None else r.profile.engine,
                transport=engine_transport,
            ),
            own_held=self.forwarder.holds.held,
        )
        # requests for a model scaled to zero wait for its first replica (docs/autoscale.md)
        self.forwarder.holds.holdable = self.load_loop.holding
        self.forwarder.holds.on_first = self.load_loop.poke
        self.feed = RoutingFeed()
        self.feed.holding = self.load_loop.holding
        self.metrics = ControllerMetrics(self)
        self.keys: ControllerKeys | None = None
        """None: no credentials are asked (`auth` not configured, loopback only)."""
        if settings.auth is not None:
            self.keys = ControllerKeys(
                admin_hashes=settings.auth.admin_hashes,
                api_key_hashes=settings.auth.api_key_hashes,
                secret=load_secret(settings.auth.secret_file),
                nodes=(NodeCredential(*row) for row in self.store.credentials()),
                router_hashes=settings.auth.router_hashes,
                reader_hashes=settings.auth.reader_hashes,
            )
            # the controller calls a node at the address its credential is bound to, only
            self._agent_urls: dict[NodeId, str] = {
                NodeId(c.node): c.agent_url for c in self.keys.nodes()
            }
        else:
            self._agent_urls = self.store.agent_urls()
        self._core: Controller | None = None
        self._lock = asyncio.Lock()
        self._wake_at: int | None = None
        self._wake = asyncio.Event()
        # the event log: the store's newest `events_kept` events (numbered on from there: a
        # restart repeats no number), then this process's, each committed before it is here;
        # `_events_dropped` is the number of `_events[0]`
        self._events_dropped, self._events = self.store.load_events()
        self.committer = Committer(
            self.store, self._carry_out, fatal, epoch=lambda: self.leadership.epoch
        )
        self.leadership = Leadership(
            self.store,
            settings.name,
            settings.timings.lease_ms,
            self.committer.run,
            fatal,
            url=settings.advertise_url,
        )
        self.delivery = Delivery(
            self._agent_urls,
            self.keys,
            tls=settings.agents_tls,
            transport=agent_transport,
            epoch=lambda: self.leadership.epoch or 0,
            acting=self.leadership.acting,
        )
        self._misbound: dict[NodeId, str] = {}
        self._loop_task: asyncio.Task[None] | None = None
        self.histograms = ControllerTimings()
        self.lag = LagMonitor(self._lagged, self.histograms.loop_lateness)
        self.gc_pauses: GcPauses | None = None
        """Set by the controller process (`main.py`), not by one runtime among many."""

    def fail(self, message: str) -> None:
        """Stop the process (as a failed commit does): it cannot go on."""
        self._fatal(message)

    def now_ms(self) -> int:
        return self._epoch0_ms + (time.monotonic_ns() - self._t0_ns) // 1_000_000

    @property
    def core(self) -> Controller:
        if self._core is None:
            raise Refused("the controller is not running", 503)
        return self._core

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        s = self.settings
        self.delivery.open()
        self.forwarder.open()
        self.committer.start()
        await self.leadership.claim()  # a standby waits here until it leads
        self.leadership.start()
        self._reload_nodes()  # what its predecessors learned while it waited
        # and the event log as they left it: a standby read it when it started, and its own
        # events are numbered on from the last they committed
        self._events_dropped, self._events = self.store.load_events()
        restored = self.store.load()
        async with self._lock:
            if restored != DurableState():
                log.info(
                    "restoring from %s: %d profiles, %d deployments, %d nodes, %d replicas",
                    s.store,
                    len(restored.profiles),
                    len(restored.deployments),
                    len(restored.nodes),
                    len(restored.replicas),
                )
                if s.profiles or s.deployments:
                    log.warning(
                        "the store holds state: the config's profiles and deployments are not "
                        "applied (change them through the admin API)"
                    )
                self._core = Controller(s.timings, restored=restored)
            else:
                self._core = Controller(s.timings)
                for profile in s.profiles:
                    self._apply(self._core.handle(ApplyProfile(profile), self.now_ms()))
                for dep in s.deployments:
                    self._apply(self._core.handle(ApplyDeployment(dep), self.now_ms()))
            # The core judges nothing before the agents could answer: it counts each one's
            # time from when its request was delivered, not from when it was queued (a commit
            # slow to reach the disk, or a large fleet's requests leaving a few connections at
            # a time, must not use it up and have healthy nodes declared lost).
            for policy in s.autoscale:  # configuration, given at every start
                self._apply(self._core.handle(ApplyAutoscale(policy), self.now_ms()))
            core = self._core
            self.delivery.on_report_tried = lambda node: core.report_delivered(node, self.now_ms())
            started = self._apply(core.start(self.now_ms(), awaits_delivery=True))
        if started is not None:
            await started  # durable, and the report requests to every known agent queued
        self._loop_task = asyncio.create_task(self._reconcile_loop())
        self.load_loop.start()
        self.lag.start()
        if self.gc_pauses is not None:
            self.gc_pauses.start()

    async def stop(self) -> None:
        if self.gc_pauses is not None:
            await self.gc_pauses.stop()
        await self.load_loop.stop()
        await self.lag.stop()
        await self.leadership.stop()
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
            self._loop_task = None
        await self.committer.close()
        await self.delivery.close()
        await self.forwarder.aclose()
        self._core = None
        self.store.close()

    async def _reconcile_loop(self) -> None:
        """Tick the core when it asked to be called (`wake_at_ms`), never sooner."""
        while True:
            wake_at = self._wake_at
            delay_ms = None if wake_at is None else wake_at - self.now_ms()
            if delay_ms is None or delay_ms > 0:
                self._wake.clear()
                timeout = None if delay_ms is None else delay_ms / 1000
                with suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
                continue
            # served between two reconciles, also when the core asked for the next at once (the
            # slices of a large operation, `control/slices.py`)
            await asyncio.sleep(0)
            await self.lag.catch_up()  # a late tick judges no silence the core has not excused
            async with self._lock:
                self._wake_at = None
                try:
                    step = self.core.tick(self.now_ms())
                except Exception as e:
                    log.exception("the core failed in a reconcile")
                    self._fatal(f"the core failed in a reconcile: {e!r}")
                    raise
                self._apply(step)

    # --- carrying out a step (never awaits) --------------------------------------------------

    def _apply(
        self, step: Step, answered_in_band: NodeId | None = None
    ) -> asyncio.Future[None] | None:
        """Hand `step` to the committer: carried out once durable (the future resolves then;
        None: carried out already, it had nothing to write)."""
        if step.wake_at_ms is not None:
            self._arm(step.wake_at_ms)
        return self.committer.submit(step, answered_in_band)

    def _carry_out(self, step: Step, answered_in_band: NodeId | None) -> None:
        def send(cmd: ControllerCommand) -> None:
            if isinstance(cmd, RequestReport) and cmd.node == answered_in_band:
                return  # answered in the reply itself
            self.delivery.send(cmd)

        def committed(_writes: tuple[Write, ...]) -> None:
            pass  # the committer made them durable before this is called

        # durable before anything leaves the process; events before commands
        apply_step(step, commit=committed, publish=self._record, send=send)

    def _arm(self, wake_at_ms: int) -> None:
        if self._wake_at is None or wake_at_ms < self._wake_at:
            self._wake_at = wake_at_ms
        self._wake.set()

    def _record(self, ev: TraceEvent) -> None:
        log.info("%s %s", ev.kind, " ".join(f"{k}={v}" for k, v in ev.subjects if k != "argv"))
        self._events.append(ev)
        # at least `events_kept` kept, at most twice as many: amortised O(1), halved in one go
        if len(self._events) >= 2 * self.settings.events_kept:
            drop = len(self._events) - self.settings.events_kept
            del self._events[:drop]
            self._events_dropped += drop
        self.router.follow(ev)
        self.feed.record(ev)
        self.metrics.record(ev)

    # --- inputs ------------------------------------------------------------------------------

    async def _handle(self, event: ControllerEvent, answered_in_band: NodeId | None = None) -> Step:
        async with self._lock:
            step = self._decide(event)
            done = self._apply(step, answered_in_band)
        if done is not None:
            await done  # answered once what it decided is durable
        return step

    def _decide(self, event: ControllerEvent) -> Step:
        """The core's step for `event` (the caller holds the lock)."""
        try:
            return self.core.handle(event, self.now_ms())
        except ValueError as e:  # the core refuses (an unknown profile, say), changing nothing
            raise Refused(str(e)) from None
        except Exception as e:
            log.exception("the core failed on %s", type(event).__name__)
            self._fatal(f"the core failed on {type(event).__name__}: {e!r}")
            raise

    async def handle_all(self, events: list[ControllerEvent]) -> None:
        """Several events in one go: no reconcile runs between them (the whole set is placed
        together, as the twin applies a scenario's deployments). Check them first: a refusal
        part way leaves the events before it applied."""
        done: list[asyncio.Future[None]] = []
        async with self._lock:
            for event in events:
                fut = self._apply(self._decide(event))
                if fut is not None:
                    done.append(fut)
        for fut in done:
            await fut

    async def operate(self, event: ControllerEvent) -> Step:
        """An operator's event (`control/operator.py`): decided, durable, then answered; a refusal
        raises `Refused` (422) and changes nothing."""
        return await self._handle(event)

    # --- views -------------------------------------------------------------------------------

    async def _lagged(self, late_ms: int) -> None:
        if self._core is not None:
            await self._handle(ControllerLagged(late_ms))
