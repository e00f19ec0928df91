"""The controller's routing feed: what a router process follows to know where to send requests.

Role: `GET /v1/router/feed?after=N&epoch=E&wait_ms=W` (docs/router.md). `RoutingFeed` keeps the
routing events (`control.routing.FEED_KINDS`) the controller published, numbered from 0 in this
process, each already in its wire form; `read` answers a router with the events after `after`,
the deployed models, and, when the router cannot continue from what it has, a snapshot of the
routable replicas (`control.routing.snapshot_of`) to `resync` from. The wire forms of a page and
its parts (`FeedPageW`, `snapshot_entry`, `event_of`) are shared with the router's follower.

Invariants:
- `epoch` is random per controller process: a router that saw another epoch (a restarted
  controller, whose numbering starts again) or asks for events the feed no longer keeps, or
  for ones it never had, gets a snapshot, then the events from it.
- A snapshot is taken from the core, which is never behind the events published: every event
  before `next` is reflected in it; events after it that the core already reflects are applied
  again, which changes nothing (joins and leaves are idempotent, the last one wins).
- A read with nothing new waits (at most `MAX_WAIT_MS`) and wakes as soon as an event is
  recorded or the deployed models change (`touch`). A read costs the events it returns; only a
  resync costs the replica table.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Iterable
from contextlib import suppress
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict

from llmgw_twin.control.model import ModelName, ReplicaId, TraceEvent
from llmgw_twin.control.routing_feed import FEED_KINDS, SnapshotEntry, SnapshotState

FEED_KEPT = 10_000
"""The feed keeps at least this many recent routing events (at most twice as many); a router
further behind gets a snapshot."""
FEED_PAGE = 5_000
"""The most events one page carries: a router further behind follows `next`."""
MAX_WAIT_MS = 30_000
"""The longest a read waits for something new (`wait_ms` is capped to it)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Str = Annotated[str, Strict(), Field(max_length=4096)]
Int = Annotated[int, Strict(), Field(ge=0)]


Role = Literal["prefill", "decode"]


class FeedEventW(_Strict):
    """A routing event: a replica of `model` joins (with its leader `endpoint`) or leaves; a
    join without an endpoint, or with `ready: false`, says it is not routable (a leave)."""

    t_ms: Annotated[int, Strict()]
    kind: Str
    model: Str
    replica: Str
    endpoint: Str | None = None
    ready: Annotated[bool, Strict()] | None = None
    group: Str | None = None
    role: Role | None = None


class SnapshotEntryW(_Strict):
    model: Str
    replica: Str
    state: SnapshotState
    endpoint: Str | None = None
    group: Str | None = None
    role: Role | None = None


class FeedPageW(_Strict):
    """One answer of the feed."""

    epoch: Str
    """This controller process's random id."""
    next: Int
    """Pass it back as `after` (with this `epoch`) to go on from here."""
    models: list[Str]
    """The deployed models, whether or not any replica of them is routable."""
    holding: list[Str] = []
    """The models whose requests a router holds while none of their replicas is routable
    (autoscaled with `scale_to_zero`, `router/holding.py`); left out when none."""
    snapshot: list[SnapshotEntryW] | None
    """Set when the router must resync: every routable replica, and the ones this controller
    restored and has not judged yet (`adopting`)."""
    events: list[FeedEventW]
    """The routing events after `after` (after `next` of the snapshot's own moment)."""


def event_wire(ev: TraceEvent) -> dict[str, Any] | None:
    """The wire form of a routing event; None for any other event, or one without a subject."""
    if ev.kind not in FEED_KINDS:
        return None
    model, replica, endpoint = ev.get("model"), ev.get("replica"), ev.get("endpoint")
    if not isinstance(model, str) or not isinstance(replica, str):
        return None
    out: dict[str, Any] = {"t_ms": ev.t_ms, "kind": ev.kind, "model": model, "replica": replica}
    if isinstance(endpoint, str):
        out["endpoint"] = endpoint
    ready = ev.get("ready")
    if isinstance(ready, bool):
        out["ready"] = ready
    group, role = ev.get("group"), ev.get("role")
    if isinstance(group, str) and isinstance(role, str):  # a role group's member
        out["group"], out["role"] = group, role
    return out


def event_of(w: FeedEventW) -> TraceEvent:
    """The event as the core's `Router.follow` reads it: the subjects it looks at, only."""
    return TraceEvent.of(
        w.t_ms,
        w.kind,
        model=w.model,
        replica=w.replica,
        endpoint=w.endpoint,
        ready=w.ready,
        group=w.group,
        role=w.role,
    )


def snapshot_wire(entries: Iterable[SnapshotEntry]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for e in entries:
        item: dict[str, Any] = {
            "model": e.model,
            "replica": e.replica,
            "state": e.state.value,
            "endpoint": e.endpoint,
        }
        if e.group:
            item["group"], item["role"] = e.group, e.role
        out.append(item)
    return out


def snapshot_entry(w: SnapshotEntryW) -> SnapshotEntry:
    return SnapshotEntry(
        ModelName(w.model), ReplicaId(w.replica), w.state, w.endpoint, w.group or "", w.role or ""
    )


class RoutingFeed:
    def __init__(self, epoch: str | None = None, kept: int = FEED_KEPT) -> None:
        self.epoch = epoch if epoch is not None else secrets.token_hex(8)
        self._kept = kept
        self._events: list[dict[str, Any]] = []
        self._first = 0  # the number of `_events[0]`
        self._changed = asyncio.Event()
        self.reads = 0
        self.resyncs = 0
        """Reads answered, and those answered with a snapshot."""
        self.holding: Callable[[], list[str]] = list
        """The models a router holds requests for at zero replicas (the controller's policies)."""

    @property
    def next(self) -> int:
        return self._first + len(self._events)

    def record(self, ev: TraceEvent) -> None:
        """Keep `ev` if a router needs it (never awaits)."""
        wire = event_wire(ev)
        if wire is None:
            return
        self._events.append(wire)
        if len(self._events) >= 2 * self._kept:  # amortised O(1): halve once in a while
            drop = len(self._events) - self._kept
            del self._events[:drop]
            self._first += drop
        self.touch()

    def touch(self) -> None:
        """Wake every waiting read: something a router shows changed."""
        self._changed.set()
        self._changed = asyncio.Event()

    def can_continue(self, after: int, epoch: str | None) -> bool:
        return epoch == self.epoch and self._first <= after <= self.next

    async def read(
        self,
        after: int,
        epoch: str | None,
        wait_ms: int,
        snapshot: Callable[[], Iterable[SnapshotEntry]],
        models: Callable[[], list[str]],
    ) -> dict[str, Any]:
        """The page for a router that has everything before `after` of `epoch`."""
        self.reads += 1
        if not self.can_continue(after, epoch):
            self.resyncs += 1
            return self._page(self.next, snapshot_wire(snapshot()), models())
        if after == self.next and wait_ms > 0:
            changed = self._changed
            with suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), min(wait_ms, MAX_WAIT_MS) / 1000)
            if not self.can_continue(after, epoch):  # trimmed past it while waiting
                self.resyncs += 1
                return self._page(self.next, snapshot_wire(snapshot()), models())
        return self._page(after, None, models())

    def _page(
        self, after: int, snapshot: list[dict[str, Any]] | None, models: list[str]
    ) -> dict[str, Any]:
        start = after - self._first
        events = self._events[start : start + FEED_PAGE]
        page = {
            "epoch": self.epoch,
            "next": after + len(events),
            "models": models,
            "snapshot": snapshot,
            "events": events,
        }
        holding = self.holding()
        if holding:
            page["holding"] = holding
        return page
