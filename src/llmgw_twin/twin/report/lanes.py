"""The lanes of a run's HTML page, read from its trace: one per node, one per replica, one for the
controller, each a set of rows of segments (states over virtual time), marks (instants) and the
spans of the faults that hit it.

Everything here comes from the `RunResult` alone (the trace, the scenario's faults), so the page
is a function of the run: same scenario and seed, same page. What the trace cannot say, the lanes
do not guess: a node's health is the controller's view of it, and a dead node's shards last until
the controller drops them; the faults' own spans show what really happened to the node.

The parts a lane is made of (`Seg`, `Mark`, `Lane`) and how long each fault's span lasts are
`lane_model.py`'s, re-exported here.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable

from llmgw_twin.control.model import TraceEvent
from llmgw_twin.twin.report.lane_model import Lane, Mark, Seg, _fault_for, _Open, fault_id
from llmgw_twin.twin.report.text import describe
from llmgw_twin.twin.world.faults import fault_subjects
from llmgw_twin.twin.world.runner import RunResult
from llmgw_twin.units import fmt_duration, fmt_ms

__all__ = ["Lane", "Lanes", "Mark", "Seg", "fault_id"]


def _span(t: int, end: int) -> str:
    return f"{fmt_ms(t)} to {fmt_ms(end)} ({fmt_duration(max(0, end - t))})"


class Lanes:
    """Reads a run's trace once, in order, into its lanes."""

    def __init__(self, result: RunResult) -> None:
        sc = result.scenario
        self.end = sc.duration_ms
        self.nodes: dict[str, Lane] = {}
        self._health: dict[str, _Open] = {}
        for info in sc.all_nodes:
            self._node(info.node, info.fabric)
        self.fabric_nodes = {str(f): tuple(map(str, nodes)) for f, nodes in sc.fabrics}
        self.controller = Lane("controller", "controller", "", {"state": [], "fleet": []})
        self.replicas: dict[str, Lane] = {}
        self._ctl: _Open = _Open("starting", 0)
        self._rep: dict[str, _Open] = {}
        self._open_shards: dict[str, list[Seg]] = {}
        self._opened: dict[tuple[str, str], tuple[list[Seg], Seg]] = {}
        """(node, what) -> the row and the segment of a state still on: links, GPUs, holds."""
        self._faults = iter(enumerate(sc.faults))
        handlers: dict[str, Callable[[TraceEvent], None]] = {
            "fault.injected": self._fault,
            "node.joined": lambda ev: self._health_to(ev, "alive"),
            "node.recovered": lambda ev: self._health_to(ev, "alive"),
            "node.suspect": lambda ev: self._health_to(ev, "suspect"),
            "node.lost": lambda ev: self._health_to(ev, "lost"),
            "node.forgotten": lambda ev: self._health_to(ev, "forgotten"),
            "node.link_down": self._link,
            "node.link_up": lambda ev: self._close((str(ev.get("node")), "link"), ev.t_ms),
            "node.quarantined": self._quarantined,
            "node.unquarantined": self._unquarantined,
            "gpu.failed": self._gpu,
            "gpu.cleared": self._gpu,
            "fleet.hold": self._hold,
            "fleet.resumed": self._hold,
            "controller.started": self._started,
            "shard.started": self._shard_started,
        }
        for ev in result.trace:
            handler = handlers.get(ev.kind)
            if handler is not None:
                handler(ev)
            elif ev.kind.startswith("replica.") or ev.kind == "shard.serving":
                self._replica_event(ev)
            else:  # any other kind: a mark on its node's lane, or the controller's
                node = ev.get("node")
                lane = self.controller if node is None else self._node(str(node))
                tip = f"{fmt_ms(ev.t_ms)} {ev.kind} {describe(ev)}"
                lane.marks.append(Mark(ev.t_ms, ev.kind, tip, {"data-t-ms": str(ev.t_ms)}))
        self._finish()

    # --- lanes and rows ---------------------------------------------------------------------

    def _node(self, name: str, fabric: str = "") -> Lane:
        lane = self.nodes.get(name)
        if lane is None:
            rows: dict[str, list[Seg]] = {"health": [], "link": [], "gpus": [], "quarantine": []}
            lane = self.nodes[name] = Lane(f"node:{name}", name, fabric, rows)
            self._health[name] = _Open("unregistered", 0)
        return lane

    def _replica(self, replica: str) -> Lane:
        lane = self.replicas.get(replica)
        if lane is None:
            lane = self.replicas[replica] = Lane(f"replica:{replica}", replica, "", {"state": []})
        return lane

    def node_shard_rows(self, node: str) -> list[list[Seg]]:
        """A node's shards, stacked into as few rows as keep them apart."""
        rows: list[list[Seg]] = []
        shards = self.nodes[node].rows.get("shards", [])
        for seg in sorted(shards, key=lambda s: (s.start_ms, s.attrs["data-shard"])):
            for row in rows:
                if row[-1].end_ms <= seg.start_ms:
                    row.append(seg)
                    break
            else:
                rows.append([seg])
        return rows

    # --- nodes ------------------------------------------------------------------------------

    def _health_to(self, ev: TraceEvent, state: str) -> None:
        node = str(ev.get("node"))
        lane = self._node(node, str(ev.get("fabric") or ""))
        cur = self._health[node]
        if cur.state == state:
            return
        self._push(lane.rows["health"], cur, ev.t_ms, f"{node}: {cur.state}")
        self._health[node] = _Open(state, ev.t_ms)

    def _open(self, key: tuple[str, str], row: list[Seg], seg: Seg) -> None:
        """Start a state that lasts until `_close(key)` (or the end): `seg`'s end is unknown."""
        self._opened.setdefault(key, (row, seg))

    def _close(self, key: tuple[str, str], t: int) -> None:
        row, seg = self._opened.pop(key, ([], None))
        if seg is not None:
            seg.end_ms, seg.tip = t, f"{seg.tip}, {_span(seg.start_ms, t)}"
            row.append(seg)

    def _link(self, ev: TraceEvent) -> None:
        node = str(ev.get("node"))
        seg = Seg("down", ev.t_ms, 0, "link down", f"{node}: fabric link down")
        self._open((node, "link"), self._node(node).rows["link"], seg)

    def _quarantined(self, ev: TraceEvent) -> None:
        node, profile = str(ev.get("node")), str(ev.get("profile"))
        until = ev.get("until_ms")
        end = min(self.end, until) if isinstance(until, int) else self.end
        tip = f"{node}: quarantined for {profile} ({ev.get('reason')}), {_span(ev.t_ms, end)}"
        label = f"quarantined: {profile}"
        seg = Seg("quarantined", ev.t_ms, end, label, tip, {"data-profile": profile})
        self._node(node).rows["quarantine"].append(seg)

    def _unquarantined(self, ev: TraceEvent) -> None:
        node, profile = str(ev.get("node")), str(ev.get("profile"))
        for seg in self._node(node).rows["quarantine"]:
            if seg.attrs.get("data-profile") in (profile, "None") and seg.end_ms > ev.t_ms:
                seg.end_ms = ev.t_ms
                seg.tip += f"; lifted at {fmt_ms(ev.t_ms)} ({ev.get('reason')})"

    def _gpu(self, ev: TraceEvent) -> None:
        node, gpu = str(ev.get("node")), str(ev.get("gpu"))
        if ev.kind == "gpu.cleared":
            self._close((node, f"gpu{gpu}"), ev.t_ms)
            return
        attrs = {"data-gpu": gpu, "data-t-ms": str(ev.t_ms)}
        lane = self._node(node)
        lane.marks.append(Mark(ev.t_ms, ev.kind, f"{fmt_ms(ev.t_ms)} GPU {gpu} failed", attrs))
        seg = Seg("gpu-failed", ev.t_ms, 0, f"GPU {gpu} failed", f"{node}: GPU {gpu} failed", attrs)
        self._open((node, f"gpu{gpu}"), lane.rows["gpus"], seg)

    # --- the controller ---------------------------------------------------------------------

    def _started(self, ev: TraceEvent) -> None:
        tip = f"controller started: {ev.get('restored')} restored, {ev.get('adopted')} adopted"
        self.controller.marks.append(Mark(ev.t_ms, ev.kind, f"{fmt_ms(ev.t_ms)} {tip}"))
        if self._ctl.since <= ev.t_ms:
            self._push(self.controller.rows["state"], self._ctl, ev.t_ms, "controller")
            self._ctl = _Open("up", ev.t_ms)

    def _hold(self, ev: TraceEvent) -> None:
        if ev.kind == "fleet.resumed":
            self._close(("", "hold"), ev.t_ms)
            return
        tip = f"{fmt_ms(ev.t_ms)} {ev.get('reason')}"
        self.controller.marks.append(Mark(ev.t_ms, ev.kind, tip))
        seg = Seg("hold", ev.t_ms, 0, "mass-loss hold", f"mass-loss hold ({ev.get('reason')})")
        self._open(("", "hold"), self.controller.rows["fleet"], seg)

    def _outage(self, cur: _Open, t: int, until: int, row: list[Seg], next_state: str) -> _Open:
        """A controller outage from `t` to `until` in one lane's row: `down`, then `next_state`
        once it is back; a second restart while it is still down extends the outage."""
        if cur.since > t and row and row[-1].state == "down":
            row[-1].end_ms = max(row[-1].end_ms, until)
            return _Open(next_state, row[-1].end_ms)
        self._push(row, cur, t, "")
        row.append(Seg("down", t, until, "", f"controller down, {_span(t, until)}"))
        return _Open(next_state, until)

    # --- faults -----------------------------------------------------------------------------

    def _fault(self, ev: TraceEvent) -> None:
        index, fault = next(self._faults, (-1, None))
        if (
            fault is None
            or fault.at_ms != ev.t_ms
            or fault_subjects(fault) != {k: v for k, v in ev.subjects if k not in ("fault",)}
        ):
            return  # the trace and the file disagree: show no span rather than a wrong one
        fid, action = fault_id(fault, index), str(ev.get("action"))
        t, end = ev.t_ms, min(self.end, ev.t_ms + _fault_for(fault))
        attrs = {"data-fault": fid, "data-action": action, "data-t-ms": str(t)}
        lanes: list[Lane] = []
        match action:
            case "kill_node" | "crash_node" | "restart_node":
                node = str(ev.get("node"))
                lanes.append(self._node(node))
                self._close((node, "down"), t)
                if action != "restart_node":
                    what = "powered off" if action == "kill_node" else "crashed"
                    seg = Seg(action, t, 0, what, f"fault {fid}: {node} {what}", dict(attrs))
                    self._open((node, "down"), lanes[0].spans, seg)
            case "fail_gpu" | "kill_engine" | "hang_engine":
                node, model = str(ev.get("node")), str(ev.get("model"))
                lanes.append(self._node(node))
                lanes.extend(self._hit_replica(node, model) if action != "fail_gpu" else ())
            case "partition" | "fabric_down":
                nodes = ev.get("nodes") or self.fabric_nodes.get(str(ev.get("fabric")), ())
                what = "partitioned" if action == "partition" else "fabric down"
                for node in map(str, nodes if isinstance(nodes, tuple) else ()):
                    lanes.append(self._node(node))
                    tip = f"fault {fid}: {node} {what}, {_span(t, end)}"
                    lanes[-1].spans.append(Seg(action, t, end, what, tip, dict(attrs)))
            case "restart_controller":
                lanes.append(self.controller)
                self._ctl = self._outage(
                    self._ctl, t, end, self.controller.rows["state"], "restoring"
                )
                tip = f"fault {fid}: controller down, {_span(t, end)}"
                self.controller.spans.append(Seg(action, t, end, "down", tip, dict(attrs)))
                for rid, cur in list(self._rep.items()):
                    rows = self.replicas[rid].rows["state"]
                    self._rep[rid] = self._outage(cur, t, end, rows, "adopting")
            case _:  # operator actions go through the controller's API
                lanes.append(self.controller)
                if ev.get("node") is not None:
                    lanes.append(self._node(str(ev.get("node"))))
        for lane in lanes:
            lane.marks.append(Mark(t, "fault", f"{fmt_ms(t)} fault {fid}: {action}", dict(attrs)))

    def _hit_replica(self, node: str, model: str) -> list[Lane]:
        """An engine fault's replica: the first (by id, rank) of `model` with a shard on the
        node, as the world picks it."""
        shards = sorted(
            (s.attrs["data-replica"], s.attrs["data-rank"])
            for segs in self._open_shards.values()
            for s in segs
            if s.attrs["data-node"] == node and s.attrs["data-model"] == model
        )
        return [self._replica(shards[0][0])] if shards else []

    # --- replicas and shards ----------------------------------------------------------------

    def _shard_started(self, ev: TraceEvent) -> None:
        node, rid, rank = str(ev.get("node")), str(ev.get("replica")), str(ev.get("rank"))
        argv = ev.get("argv")
        command = shlex.join(str(a) for a in argv) if isinstance(argv, tuple) else ""
        tip = f"{rid} rank {rank} on {node}, started {fmt_ms(ev.t_ms)}\n$ {command}"
        attrs = {
            "data-shard": f"{rid}/{rank}",
            "data-node": node,
            "data-replica": rid,
            "data-rank": rank,
            "data-model": str(ev.get("model")),
            "data-t-ms": str(ev.t_ms),
        }
        seg = Seg("shard", ev.t_ms, self.end, f"{rid}/{rank}", tip, attrs)
        self._node(node).rows.setdefault("shards", []).append(seg)
        self._open_shards.setdefault(rid, []).append(seg)
        self._replica_event(ev)

    def _replica_event(self, ev: TraceEvent) -> None:
        rid = str(ev.get("replica"))
        lane = self._replica(rid)
        t, kind, reason = ev.t_ms, ev.kind, ev.get("reason")
        if not lane.subtitle and ev.get("model") is not None:
            lane.subtitle = str(ev.get("model"))
        nodes, fabric = ev.get("nodes"), ev.get("fabric")
        if isinstance(nodes, tuple) and fabric is not None:
            lane.subtitle = f"{ev.get('model')} on {','.join(map(str, nodes))} ({fabric})"
        why = f" ({reason})" if reason is not None else ""
        state = {
            "replica.unplaceable": "unplaceable",
            "replica.backoff": "backoff",
            "replica.placed": "placed",
            "replica.ready": "ready",
            "replica.recovered": "ready",
            "replica.routable": "ready",
            "replica.degraded": "degraded",
            "replica.unroutable": "unroutable",
            "replica.moving": "moving",
            "replica.move_aborted": "ready",
        }.get(kind)
        cur = self._rep.get(rid)
        if kind == "shard.started" and cur is not None and cur.state == "placed":
            state = "loading"
        if kind == "replica.adopted":
            state = "ready" if ev.get("ready") else "loading"
        if kind == "replica.backoff" and isinstance(ev.get("delay_ms"), int):
            why = f" (waits {fmt_duration(int(str(ev.get('delay_ms'))))})"
        if state in ("ready", "moving") or (kind == "replica.adopted" and ev.get("ready")):
            for seg in self._open_shards.get(rid, []):
                seg.ready_ms = t if seg.ready_ms is None else seg.ready_ms
        if kind not in ("shard.started", "shard.serving", "replica.placed", "replica.ready"):
            self._mark(lane, ev, why)
        if kind in ("replica.failed", "replica.reaped"):
            if cur is not None:
                self._push(lane.rows["state"], cur, t, rid)
            self._rep.pop(rid, None)
            for seg in self._open_shards.pop(rid, []):
                seg.end_ms = t
                seg.tip += f"\nstopped {fmt_ms(t)}{why}"
            return
        if state is None or (cur is not None and cur.state == state):
            return
        if cur is not None:
            self._push(lane.rows["state"], cur, t, rid)
        self._rep[rid] = _Open(state, t, why.strip())

    def _mark(self, lane: Lane, ev: TraceEvent, why: str) -> None:
        extra = f" to {ev.get('to')}" if ev.get("to") is not None else ""
        tip = f"{fmt_ms(ev.t_ms)} {ev.kind}{extra}{why}"
        lane.marks.append(Mark(ev.t_ms, ev.kind, tip, {"data-t-ms": str(ev.t_ms)}))

    def _push(self, row: list[Seg], cur: _Open, t: int, who: str) -> None:
        if t > cur.since:
            tip = f"{who + ': ' if who else ''}{cur.state}, {_span(cur.since, t)}"
            row.append(
                Seg(cur.state, cur.since, t, cur.state, tip + (f" {cur.tip}" * bool(cur.tip)))
            )

    def _finish(self) -> None:
        for node, cur in self._health.items():
            self._push(self.nodes[node].rows["health"], cur, self.end, node)
        for key in list(self._opened):
            self._close(key, self.end)
        self._push(self.controller.rows["state"], self._ctl, self.end, "controller")
        for rid, cur in self._rep.items():
            self._push(self.replicas[rid].rows["state"], cur, self.end, rid)
