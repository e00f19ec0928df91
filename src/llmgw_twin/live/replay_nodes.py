"""A node's silences in an event log, as faults: when its heartbeats stopped, and whether it was
powered off, crashed, rebooted, cut off or had its agent restart (docs/live-twin.md, "Replay",
"How faults are inferred"); and the nodes onboarded while the controller ran.

Role: `silences(...)` for `replay_infer.infer_faults`, which holds the rest of the rules; the
types and constants both use (`Inferred`, `Clock`, `REPORT_MS`, `EXIT`) live here.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

from llmgw_twin.control.model import Timings, TraceEvent

EXIT = re.compile(r"^shard \d+ (exited with code -?\d+|went \w+) on (\S+)$")
"""A replica's failure because a shard's engine exited (a signal is a negative code, as a
real process reports it) or its state went down."""
_VANISHED = re.compile(r"^shard \d+ vanished from (\S+)")
REPORT_MS = 2
"""An agent's report reaches the controller this long after what it reports."""


@dataclass(frozen=True, slots=True)
class Inferred:
    at_ms: int
    """In the log's time: before the window's start when the fault began before it."""
    action: str
    value: object
    note: str


class Clock:
    def __init__(self, start_ms: int) -> None:
        self.start_ms = start_ms

    def __call__(self, t_ms: int) -> int:
        return max(0, t_ms - self.start_ms)

    def text(self, t_ms: int) -> str:
        from llmgw_twin.units import fmt_duration

        return "+" + fmt_duration(self(t_ms))


def added_nodes(events: list[TraceEvent], timings: Timings) -> dict[str, int]:
    """Nodes onboarded while the controller ran: the log's first word of each is its
    `node.joined`, a heartbeat interval or more after the controller's first start, and after
    its first placement (the fleet's own nodes join as it starts, and on real processes, which
    take seconds to start, before anything is placed). Node -> when it joined."""
    first = next((ev.t_ms for ev in events if ev.kind == "controller.started"), events[0].t_ms)
    placed = next((ev.t_ms for ev in events if ev.kind == "replica.placed"), None)
    seen: set[str] = set()
    out: dict[str, int] = {}
    for ev in events:
        node = ev.get("node")
        if not isinstance(node, str) or node in seen:
            continue
        seen.add(node)
        late = ev.t_ms >= first + timings.heartbeat_interval_ms
        if ev.kind == "node.joined" and late and (placed is None or ev.t_ms > placed):
            out[node] = ev.t_ms
    return out


def silences(
    window: list[TraceEvent],
    rel: Clock,
    t: Timings,
    lost_at_start: set[str],
    nodes_of: dict[str, tuple[str, ...]],
    explained: set[int],
) -> list[Inferred]:
    out: list[Inferred] = []
    half = t.heartbeat_interval_ms // 2
    by_node: dict[str, list[TraceEvent]] = {}
    for ev in window:
        if ev.kind in ("node.suspect", "node.lost", "node.recovered", "node.joined"):
            by_node.setdefault(str(ev.get("node")), []).append(ev)
    starts = [ev.t_ms for ev in window if ev.kind in ("controller.started", "controller.leader")]
    vanished: dict[str, list[int]] = {}  # a node's shards gone when it registered: a reboot
    for ev in window:
        if ev.kind == "replica.failed" and (m := _VANISHED.match(str(ev.get("reason") or ""))):
            vanished.setdefault(m.group(1), []).append(ev.t_ms)
    for node, evs in sorted(by_node.items()):
        stop: int | None = None  # just after its last heartbeat (log time), in a silence
        off = node in lost_at_start  # powered off in the replay
        lost_at: int | None = None  # when it was declared lost, in this silence
        mine: list[Inferred] = []
        for ev in evs:
            if ev.kind == "node.suspect" and stop is None and not off:
                # not one a controller found at its start: it says nothing of when
                if not any(0 <= ev.t_ms - s <= 2 * t.reconcile_interval_ms for s in starts):
                    stop = ev.t_ms - t.node_suspect_after_ms + 1
            elif ev.kind == "node.lost" and not off:
                # after its suspicion if that was timed (a mass-loss hold, a lost node paced,
                # may hold the loss back), else the loss
                stop = stop if stop is not None else ev.t_ms - t.node_lost_after_ms + 1
                note = f"{node} lost at {rel.text(ev.t_ms)}: its heartbeats stopped about then"
                mine.append(_down(window, node, stop, note, rel, t, nodes_of, explained))
                off, lost_at = True, ev.t_ms
            elif (
                ev.kind == "node.joined"
                and not off
                and stop is not None
                and not (_rebooted(vanished, node, ev))
            ):
                # registered again with its shards, never declared lost: its agent restarted
                down = {"node": node, "down_for": max(0, ev.t_ms - REPORT_MS - stop)}
                note = (
                    f"{node} silent, then registered again with its shards at {rel.text(ev.t_ms)}"
                )
                mine.append(Inferred(stop, "restart_agent", down, note))
                stop = None
            elif _rebooted(vanished, node, ev) or (ev.kind == "node.joined" and off):
                # registered with its shards gone (or joined when off): it booted again
                if not off and stop is not None:
                    note = f"{node} silent, then rebooted ({rel.text(ev.t_ms)})"
                    mine.append(_down(window, node, stop, note, rel, t, nodes_of, explained))
                note = f"{node} registered again at {rel.text(ev.t_ms)}: it booted"
                mine.append(Inferred(ev.t_ms - REPORT_MS, "restart_node", node, note))
                stop, off, lost_at = None, False, None
            elif ev.kind == "node.recovered" and stop is not None:
                if off and mine and mine[-1].action in ("kill_node", "crash_node"):
                    mine.pop()  # heard again without a reboot: it was cut off, not off
                # healed within the interval before it was heard, and not before its loss
                healed = max(ev.t_ms - half, lost_at + 1 if lost_at is not None else 0)
                span = max(1000, min(healed, ev.t_ms) - stop)
                note = f"{node} heard again at {rel.text(ev.t_ms)} without rebooting: cut off"
                part = {"nodes": [node], "for": span}
                mine.append(Inferred(stop, "partition", part, note))
                stop, off, lost_at = None, False, None
        out += mine
    return out


def _rebooted(vanished: dict[str, list[int]], node: str, ev: TraceEvent) -> bool:
    """The node registered (joined, or heard again) and its shards had vanished from it."""
    if ev.kind not in ("node.joined", "node.recovered"):
        return False
    return any(0 <= v - ev.t_ms <= 100 for v in vanished.get(node, ()))


def _down(
    window: list[TraceEvent],
    node: str,
    stop: int,
    note: str,
    rel: Clock,
    t: Timings,
    nodes_of: dict[str, tuple[str, ...]],
    explained: set[int],
) -> Inferred:
    """`kill_node` at `stop`, or `crash_node` where a replica spanning the node failed on
    another node (its peer's socket closed) in the interval its heartbeats stopped in."""
    first = bisect.bisect_left(window, stop - 100, key=lambda e: e.t_ms)
    last = bisect.bisect_right(window, stop + t.heartbeat_interval_ms + 100, key=lambda e: e.t_ms)
    for i in range(first, last):
        ev = window[i]
        if (
            ev.kind == "replica.failed"
            and ev.get("node") != node
            and node in nodes_of.get(str(ev.get("replica")), ())
            and EXIT.match(str(ev.get("reason") or ""))
        ):
            explained.add(i)
            why = f"{note}; replica {ev.get('replica')} lost its peer on it at {rel.text(ev.t_ms)}"
            return Inferred(ev.t_ms - REPORT_MS, "crash_node", node, why)
    return Inferred(stop, "kill_node", node, note)
