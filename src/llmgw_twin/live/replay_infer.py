"""The faults an event log shows inside a window, as scenario faults (docs/live-twin.md, "Replay",
"How faults are inferred").

Role: `infer_faults(...)` reads the window's events and returns `Inferred` faults, each at a
time relative to the window's start, with a note saying which events it was read from. The
rules, in short (T = the logged time):

- a node lost with no reboot after: `kill_node` just after its last heartbeat, T -
  node_lost_after + 1 ms (so the twin, whose heartbeats fall elsewhere in the interval, loses it
  no later than the log says, and up to one heartbeat interval earlier); if it later
  joins again, `restart_node` just before; if it is later heard again without rejoining, a
  `partition` from then until half an interval before it was heard;
- a node suspect and heard again, never lost: a `partition` likewise, from T - node_suspect_after
  + 1 ms;
- a replica failed because a shard exited or went down, not the infrastructure's doing and no GPU
  failing with it: `kill_engine` of that model on that node, 2 ms before (the agent's report);
- a failed GPU: `fail_gpu`, 2 ms before the replica that failed with it (or before it);
- a leader found not answering its probe: `hang_engine`, one probe interval before;
- fabric links down on every node of a fabric that is up, within 100 ms: `fabric_down` until
  the first link comes back; on some nodes only: `cut_fabric_link` per node;
- a controller that started again (`controller.started` after an earlier one):
  `restart_controller`, down from 1 ms after the old process's last event to the new process's
  start (its `controller.leader`, else one reconcile interval before `controller.started`);
- the operator's calls: `cordon`, `uncordon`, `drain`, `set_profile`, `delete_deployment`, and
  `set_replicas` where the wanted count changed (`replay_fold.py`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from llmgw_twin.control.model import Timings, TraceEvent

_EXIT = re.compile(r"^shard \d+ (exited with code \d+|went \w+) on (\S+)$")
_HUNG = re.compile(r" on (\S+) not answering its health probe")
REPORT_MS = 2
"""An agent's report reaches the controller this long after what it reports."""


@dataclass(frozen=True, slots=True)
class Inferred:
    at_ms: int
    action: str
    value: object
    note: str


def infer_faults(
    window: list[TraceEvent],
    before: list[TraceEvent],
    start_ms: int,
    end_ms: int,
    timings: Timings,
    fabrics: dict[str, tuple[str, ...]],
    lost_at_start: set[str],
    scales: list[tuple[int, str, int]],
) -> list[Inferred]:
    out: list[Inferred] = []
    rel = _Clock(start_ms)
    out += _silences(window, rel, timings, lost_at_start)
    out += _engines_and_gpus(window, rel, timings)
    out += _links(window, rel, end_ms, fabrics, lost_at_start)
    out += _restarts(window, before, rel, timings)
    out += _operator(window, rel)
    for t, model, count in scales:
        if start_ms <= t <= end_ms:
            note = f"the wanted count of {model} became {count} at {rel.text(t)}"
            out.append(Inferred(rel(t), "set_replicas", {"model": model, "replicas": count}, note))
    return sorted(out, key=lambda f: f.at_ms)


class _Clock:
    def __init__(self, start_ms: int) -> None:
        self.start_ms = start_ms

    def __call__(self, t_ms: int) -> int:
        return max(0, t_ms - self.start_ms)

    def text(self, t_ms: int) -> str:
        from llmgw_twin.units import fmt_duration

        return "+" + fmt_duration(self(t_ms))


def _silences(
    window: list[TraceEvent], rel: _Clock, t: Timings, lost_at_start: set[str]
) -> list[Inferred]:
    out: list[Inferred] = []
    half = t.heartbeat_interval_ms // 2
    by_node: dict[str, list[TraceEvent]] = {}
    for ev in window:
        if ev.kind in ("node.suspect", "node.lost", "node.recovered", "node.joined"):
            by_node.setdefault(str(ev.get("node")), []).append(ev)
    for node, evs in sorted(by_node.items()):
        stop: int | None = None  # when its heartbeats stopped (log time), in a silence
        lost = node in lost_at_start
        off = node in lost_at_start
        for ev in evs:
            if ev.kind == "node.suspect" and stop is None and not lost:
                stop = ev.t_ms - t.node_suspect_after_ms + 1
            elif ev.kind == "node.lost" and not lost:
                stop = ev.t_ms - t.node_lost_after_ms + 1
                lost = True
                note = f"{node} lost at {rel.text(ev.t_ms)}: its heartbeats stopped about then"
                out.append(Inferred(rel(stop), "kill_node", node, note))
                off = True
            elif ev.kind == "node.joined" and off:
                note = f"{node} joined again at {rel.text(ev.t_ms)}: it booted"
                out.append(Inferred(rel(ev.t_ms - REPORT_MS), "restart_node", node, note))
                stop, lost, off = None, False, False
            elif ev.kind == "node.recovered" and stop is not None:
                if lost and out and out[-1].action == "kill_node" and out[-1].value == node:
                    out.pop()  # heard again without a reboot: it was cut off, not off
                span = max(1000, ev.t_ms - half - stop)
                note = f"{node} heard again at {rel.text(ev.t_ms)} without rebooting: cut off"
                part = {"nodes": [node], "for": span}
                out.append(Inferred(rel(stop), "partition", part, note))
                stop, lost, off = None, False, False
    return out


def _engines_and_gpus(window: list[TraceEvent], rel: _Clock, t: Timings) -> list[Inferred]:
    out: list[Inferred] = []
    gpu_fails = [ev for ev in window if ev.kind == "gpu.failed"]
    hung: set[tuple[str, str]] = set()
    for ev in window:
        node, model = str(ev.get("node")), str(ev.get("model"))
        reason = str(ev.get("reason") or "")
        if ev.kind == "replica.degraded" and (m := _HUNG.search(reason)):
            hung.add((m.group(1), model))
            note = f"replica {ev.get('replica')} not answering at {rel.text(ev.t_ms)}"
            value = {"node": m.group(1), "replica_of": model}
            out.append(Inferred(rel(ev.t_ms - t.probe_interval_ms), "hang_engine", value, note))
        elif ev.kind == "replica.failed" and _EXIT.match(reason):
            if (node, model) in hung:
                continue
            if any(g.get("node") == node and 0 <= g.t_ms - ev.t_ms <= 100 for g in gpu_fails):
                continue  # the GPU's failure, below
            note = f"replica {ev.get('replica')} failed at {rel.text(ev.t_ms)}: {reason}"
            value = {"node": node, "replica_of": model}
            out.append(Inferred(rel(ev.t_ms - REPORT_MS), "kill_engine", value, note))
    for g in gpu_fails:
        node = str(g.get("node"))
        first = min(
            (
                ev.t_ms
                for ev in window
                if ev.kind == "replica.failed"
                and ev.get("node") == node
                and 0 <= g.t_ms - ev.t_ms <= 100
            ),
            default=g.t_ms,
        )
        note = f"GPU {g.get('gpu')} of {node} failed at {rel.text(g.t_ms)}"
        value = {"node": node, "gpu": g.get("gpu")}
        out.append(Inferred(rel(first - REPORT_MS), "fail_gpu", value, note))
    return out


def _links(
    window: list[TraceEvent],
    rel: _Clock,
    end_ms: int,
    fabrics: dict[str, tuple[str, ...]],
    lost_at_start: set[str],
) -> list[Inferred]:
    out: list[Inferred] = []
    downs = [ev for ev in window if ev.kind == "node.link_down"]
    ups = [ev for ev in window if ev.kind == "node.link_up"]
    done: set[int] = set()
    for i, ev in enumerate(downs):
        if i in done:
            continue
        fabric = str(ev.get("fabric"))
        group = [
            j
            for j, d in enumerate(downs)
            if j not in done and d.get("fabric") == fabric and 0 <= d.t_ms - ev.t_ms <= 100
        ]
        done.update(group)
        nodes = {str(downs[j].get("node")) for j in group}
        back = [u.t_ms for u in ups if u.t_ms > ev.t_ms and str(u.get("node")) in nodes]
        span = max(1000, (min(back) if back else end_ms + 1000) - ev.t_ms)
        up_nodes = set(fabrics.get(fabric, ())) - lost_at_start
        at = rel(ev.t_ms - REPORT_MS)
        if len(nodes) > 1 and up_nodes <= nodes:
            note = f"every link of {fabric} down at {rel.text(ev.t_ms)}"
            out.append(Inferred(at, "fabric_down", {"fabric": fabric, "for": span}, note))
            continue
        for node in sorted(nodes):
            mine = [u.t_ms for u in ups if u.t_ms > ev.t_ms and u.get("node") == node]
            length = max(1000, (min(mine) if mine else end_ms + 1000) - ev.t_ms)
            note = f"{node}'s fabric link down at {rel.text(ev.t_ms)}"
            out.append(Inferred(at, "cut_fabric_link", {"node": node, "for": length}, note))
    return out


def _restarts(
    window: list[TraceEvent], before: list[TraceEvent], rel: _Clock, t: Timings
) -> list[Inferred]:
    out: list[Inferred] = []
    seen = any(ev.kind == "controller.started" for ev in before)
    history = before + window
    offset = len(before)
    for i, ev in enumerate(window):
        if ev.kind != "controller.started":
            continue
        if not seen:
            seen = True
            continue
        k = offset + i
        leader = next(
            (
                history[j].t_ms
                for j in range(k, -1, -1)
                if history[j].kind == "controller.leader"
                and history[j].t_ms <= ev.t_ms
                and ev.t_ms - history[j].t_ms <= 10 * t.reconcile_interval_ms
            ),
            None,
        )
        began = leader if leader is not None else ev.t_ms - t.reconcile_interval_ms
        last = max((e.t_ms for e in history[:k] if e.t_ms < began), default=began - 1)
        died = max(last + 1, rel.start_ms)
        down = max(0, began - died)
        note = f"a controller started again at {rel.text(ev.t_ms)}"
        out.append(Inferred(rel(died), "restart_controller", {"down_for": down}, note))
    return out


_OPERATOR = {
    "node.cordoned": "cordon",
    "node.uncordoned": "uncordon",
    "node.draining": "drain",
}


def _operator(window: list[TraceEvent], rel: _Clock) -> list[Inferred]:
    out: list[Inferred] = []
    draining = {(ev.t_ms, ev.get("node")) for ev in window if ev.kind == "node.draining"}
    for ev in window:
        note = f"{ev.kind} at {rel.text(ev.t_ms)}: the operator's call"
        if ev.kind in _OPERATOR:
            if ev.kind == "node.cordoned" and (ev.t_ms, ev.get("node")) in draining:
                continue
            out.append(Inferred(rel(ev.t_ms), _OPERATOR[ev.kind], str(ev.get("node")), note))
        elif ev.kind == "deployment.profile_changed":
            value = {"model": ev.get("model"), "profile": ev.get("profile")}
            out.append(Inferred(rel(ev.t_ms), "set_profile", value, note))
        elif ev.kind == "deployment.deleted":
            out.append(Inferred(rel(ev.t_ms), "delete_deployment", str(ev.get("model")), note))
    return out
