"""Every node's heartbeats: the agent's timer and the delivery of each report, in virtual time.

Both kinds of event run after every other event of their millisecond, among themselves
deliveries first, then in order of node name: where a heartbeat falls among the events of its
instant is fixed by the instant and the node alone, never by when it was scheduled. That is what
lets a node's quiet heartbeats be taken out of the event queue and put back later with nothing
else reordered.

Bulk mode: a quiet heartbeat (the agent's report unchanged, the controller's answer the empty
step, and nothing waiting on the node there) changes nothing but the node's last-seen time. Once
one is delivered, the node *coasts*: its pending timer is voided, the controller sets it aside as
alive, and its heartbeats from then on are arithmetic (`next_beat + k * interval`, each delivered
`latency` later) rather than events. The moment anything about the node changes (any event at its
agent, its power, its management link, its assignment or a report request at the controller, the
controller's crash, a GPU double-booking to report), `land` works out which of those heartbeats
have happened by this event, hands the controller the last one's time, and puts the next delivery
and the next timer back in the queue where they would have been. The trace, every expectation
and every invariant come out exactly as with one event per heartbeat
(`tests/test_twin_bulk.py` compares the two byte for byte).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from heapq import heappush
from itertools import count
from typing import TYPE_CHECKING, cast

import simpy

from llmgw_twin.control.model import NodeId
from llmgw_twin.control.protocol import Heartbeat

if TYPE_CHECKING:
    from llmgw_twin.twin.world.node import SimNode
    from llmgw_twin.twin.world.sim import World

HEARTBEAT_PRIORITY = 2
"""After SimPy's NORMAL (1) and URGENT (0): a heartbeat runs last in its millisecond."""
_DELIVERY, _BEAT = 0, 1


@dataclass(slots=True)
class Coast:
    next_beat_ms: int
    """The first heartbeat timer not yet accounted for."""
    latency_ms: int
    report: Heartbeat
    last_seen_ms: int
    """When the controller last heard the node for real: the delivery that set it coasting."""


class Heartbeats:
    def __init__(self, world: World, bulk: bool) -> None:
        self.world = world
        self.env = world.env
        timings = world.timings
        self.interval_ms = timings.heartbeat_interval_ms
        # a coasting node must never be judged silent: its heartbeats are never further apart
        self.bulk = bulk and self.interval_ms < timings.node_suspect_after_ms
        self.coasting: dict[NodeId, Coast] = {}
        self._rank = {name: i for i, name in enumerate(sorted(world.nodes))}
        self._seq = count()
        self._delays: dict[NodeId, list[int]] = {}
        """Nodes whose heartbeats arrive late now (`delay_heartbeats`): the delays under way."""
        self._held: dict[NodeId, int] = {}
        """When each node's last late heartbeat arrives: later ones never overtake it."""
        self._current: int | None = None
        """Rank of the node whose heartbeat is being delivered now, if one is."""
        self.receive: Callable[[Heartbeat], bool] = lambda _msg: False
        """The controller's door: True when the heartbeat was quiet and its node settled."""
        self.on_coast: Callable[[NodeId], None] = lambda _node: None
        self.on_land: Callable[[NodeId, int], None] = lambda _node, _seen: None
        """The controller's side of `coast` and `land` (wired by its shell)."""

    # --- the event queue -----------------------------------------------------------------------

    def _push(self, at_ms: int, kind: int, node: NodeId, value: object) -> simpy.Event:
        ev = simpy.Event(self.env)
        ev._ok = True
        ev._value = value
        assert ev.callbacks is not None
        ev.callbacks.append(self._on_delivery if kind == _DELIVERY else self._on_beat)
        key = (kind, self._rank[node], next(self._seq))  # the sequence only keeps keys unique
        heappush(self.env._queue, (at_ms, HEARTBEAT_PRIORITY, key, ev))  # type: ignore[misc]
        return ev

    def start(self, node: SimNode, delay_ms: int) -> None:
        """The node's agent (re)started: its first heartbeat after `delay_ms`."""
        self._beat_at(node, self.world.now + delay_ms)

    def _beat_at(self, node: SimNode, at_ms: int) -> None:
        node.next_beat = self._push(at_ms, _BEAT, node.name, node)
        node.next_beat_at = at_ms

    def _on_beat(self, ev: simpy.Event) -> None:
        node = cast("SimNode", ev.value)
        if ev is not node.next_beat:
            return  # a timer of an agent that has died since, or of a node now coasting
        # the agent core answers a heartbeat timer with its report and nothing else
        self.send(node, node.core.heartbeat())
        self._beat_at(node, self.world.now + self.interval_ms)

    def send(self, node: SimNode, report: Heartbeat) -> None:
        latency = self.world.network.control_latency_ms(node.name)
        if latency is None:
            return
        at = self.world.now + latency
        delays = self._delays.get(node.name)
        if delays:  # late, and in the order sent (overlapping delays: the longest counts)
            at = max(at + max(delays), self._held.get(node.name, 0))
            self._held[node.name] = at
        self._push(at, _DELIVERY, node.name, report)

    def delay(self, nodes: tuple[NodeId, ...], by_ms: int) -> None:
        """From now, the heartbeats of `nodes` arrive `by_ms` late (until `undelay`)."""
        for name in nodes:
            self.land(name)  # its heartbeats are events again: each one is late
            self._delays.setdefault(name, []).append(by_ms)

    def undelay(self, nodes: tuple[NodeId, ...], by_ms: int) -> None:
        for name in nodes:
            delays = self._delays[name]
            delays.remove(by_ms)
            if not delays:
                del self._delays[name]

    def _on_delivery(self, ev: simpy.Event) -> None:
        msg = cast("Heartbeat", ev.value)
        self._current = self._rank[msg.node]
        try:
            quiet = self.receive(msg)
        finally:
            self._current = None
        if quiet and self.bulk:
            self._maybe_coast(self.world.nodes[msg.node], msg)

    # --- bulk ----------------------------------------------------------------------------------

    def _maybe_coast(self, node: SimNode, msg: Heartbeat) -> None:
        latency = self.world.network.control_latency_ms(node.name)
        if (
            not node.up
            or node.next_beat is None
            or latency is None
            or node.core.heartbeat() is not msg
            or self.world.gpu_violations
            or node.name in self._delays
            or self._held.get(node.name, -1) >= self.world.now  # late ones still on the way
        ):
            return
        self.coasting[node.name] = Coast(node.next_beat_at, latency, msg, self.world.now)
        node.next_beat = None  # the pending timer fires as a no-op
        self.on_coast(node.name)

    def land(self, name: NodeId) -> None:
        """`name` stops coasting: account for its heartbeats up to this event, and put its next
        delivery and timer back in the queue. Call before anything about the node changes."""
        coast = self.coasting.pop(name, None)
        if coast is None:
            return
        now, interval = self.world.now, self.interval_ms
        first = coast.next_beat_ms
        # timers run after everything else of their instant: those before now have happened
        beats = 0 if now <= first else (now - first - 1) // interval + 1
        delivered = beats
        if beats:
            last = first + (beats - 1) * interval + coast.latency_ms
            rank = self._rank[name]
            # a delivery of this instant has happened only if it ran before the current one
            if last > now or (last == now and (self._current is None or self._current < rank)):
                delivered -= 1
                self._push(last, _DELIVERY, name, coast.report)
        seen = coast.last_seen_ms
        if delivered:
            seen = first + (delivered - 1) * interval + coast.latency_ms
        self.on_land(name, seen)
        self._beat_at(self.world.nodes[name], first + beats * interval)

    def land_all(self) -> None:
        for name in sorted(self.coasting):
            self.land(name)
