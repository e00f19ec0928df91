"""The faults an event log shows inside a window, as scenario faults (docs/live-twin.md, "Replay",
"How faults are inferred").

Role: `infer_faults(...)` reads the window's events and returns `Inferred` faults, each at a
time of the log, with a note saying which events it was read from. The rules
(the table in the docs is their contract), in short:

- a node's silence (`replay_nodes.py`) starts just after its last heartbeat: its first
  suspicion less node_suspect_after, else its loss less node_lost_after, plus 1 ms (the twin then
  loses it no later than the log, up to a heartbeat interval earlier). Lost: `kill_node`, or
  `crash_node` when a replica spanning it died on a peer in that interval; registered with its
  shards gone, or joined after a loss: `restart_node`; joined with its shards after a silence:
  its agent restarted (`restart_agent`); heard again with them: a `partition` instead;
- a shard that exited or went down, no infrastructure cause and no GPU failing with it:
  `kill_engine`; a failed GPU: `fail_gpu`; a leader not answering its probe, or a replica never
  ready: `hang_engine`;
- fabric links down: `fabric_down` for a whole fabric, `cut_fabric_link` per node otherwise;
- a controller that started again: `restart_controller`, down 5 s at most; a lag:
  `stall_controller`;
- the operator's calls (`cordon`, `uncordon`, `drain`, `set_profile`, `delete_deployment`), a
  wanted count that changed (`set_replicas`, from `replay_fold.py`), a node onboarded
  (`add_node`, `added_nodes`).
"""

from __future__ import annotations

import re

from llmgw_twin.control.model import Timings, TraceEvent
from llmgw_twin.live.replay_nodes import EXIT, REPORT_MS, Clock, Inferred, silences

_HUNG = re.compile(r" on (\S+) not answering its health probe")
RESTART_DOWN_MS = 5_000
"""How long a restarted controller is taken to have been down, at most: the log does not say."""


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
    rel = Clock(start_ms)
    history = before + window  # the log up to the window's end
    nodes_of = _nodes_of(history)
    explained: set[int] = set()  # the window's replica.failed events a fault above explains
    out += silences(window, rel, timings, lost_at_start, nodes_of, explained)
    out += _engines_and_gpus(window, history, rel, timings, nodes_of, explained)
    out += _links(window, history, rel, end_ms, fabrics)
    out += _restarts(window, before, rel, timings)
    out += _operator(window, rel)
    for t, model, count in scales:
        if start_ms <= t <= end_ms:
            note = f"the wanted count of {model} became {count} at {rel.text(t)}"
            out.append(Inferred(t, "set_replicas", {"model": model, "replicas": count}, note))
    return sorted(out, key=lambda f: f.at_ms)


def _nodes_of(events: list[TraceEvent]) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for ev in events:
        nodes = ev.get("nodes")
        if ev.kind in ("replica.placed", "replica.adopted") and isinstance(nodes, tuple):
            out[str(ev.get("replica"))] = tuple(str(n) for n in nodes)
    return out


def _engines_and_gpus(
    window: list[TraceEvent],
    history: list[TraceEvent],
    rel: Clock,
    t: Timings,
    nodes_of: dict[str, tuple[str, ...]],
    explained: set[int],
) -> list[Inferred]:
    out: list[Inferred] = []
    gpu_fails = [ev for ev in window if ev.kind == "gpu.failed"]
    hung: set[tuple[str, str]] = set()
    for i, ev in enumerate(window):
        node, model = str(ev.get("node")), str(ev.get("model"))
        reason = str(ev.get("reason") or "")
        rid = str(ev.get("replica"))
        if ev.kind == "replica.degraded" and (m := _HUNG.search(reason)):
            if any(
                later.kind == "replica.failed"
                and later.get("replica") == rid
                and EXIT.match(str(later.get("reason") or ""))
                for later in window[i + 1 :]
            ):
                continue  # its engine had exited: the probe noticed before the exit was heard
            hung.add((m.group(1), model))
            note = f"replica {rid} not answering at {rel.text(ev.t_ms)}"
            value = {"node": m.group(1), "replica_of": model}
            out.append(Inferred(ev.t_ms - t.probe_interval_ms, "hang_engine", value, note))
        elif ev.kind == "replica.failed" and reason.startswith("not ready within"):
            leader = nodes_of.get(rid, ())[:1]
            placed = _began(history, rid, None)
            if leader and not _troubled(history, nodes_of[rid], placed, ev.t_ms):
                began = _began(history, rid, leader[0])
                note = f"replica {rid} {reason} ({rel.text(ev.t_ms)}): its engine never served"
                value = {"node": leader[0], "replica_of": model}
                out.append(Inferred(began + 1, "hang_engine", value, note))
        elif ev.kind == "replica.failed" and i not in explained and EXIT.match(reason):
            if (node, model) in hung:
                continue
            if any(g.get("node") == node and 0 <= g.t_ms - ev.t_ms <= 100 for g in gpu_fails):
                continue  # the GPU's failure, below
            note = f"replica {rid} failed at {rel.text(ev.t_ms)}: {reason}"
            value = {"node": node, "replica_of": model}
            out.append(Inferred(ev.t_ms - REPORT_MS, "kill_engine", value, note))
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
        out.append(Inferred(first - REPORT_MS, "fail_gpu", value, note))
    return out


def _began(events: list[TraceEvent], rid: str, node: str | None) -> int:
    """When the replica's engine on `node` started (its `shard.started`, else its placement);
    with no node, its placement."""
    placed = [e.t_ms for e in events if e.kind == "replica.placed" and e.get("replica") == rid]
    started = [
        e.t_ms
        for e in events
        if node is not None
        and e.kind == "shard.started"
        and e.get("replica") == rid
        and e.get("node") == node
    ]
    return max(started or placed or [0])


def _troubled(events: list[TraceEvent], nodes: tuple[str, ...], since: int, until: int) -> bool:
    """Whether a node of `nodes` had its links down, or was silent, at some time from `since`
    to `until`: a replica there that never got ready has a cause other than a hung engine."""
    links_down: set[str] = set()
    silent: set[str] = set()
    for ev in events:
        if ev.t_ms > until:
            break
        if ev.t_ms >= since and (links_down or silent):
            return True
        node = str(ev.get("node"))
        if node not in nodes:
            continue
        if ev.kind == "node.link_down":
            links_down.add(node)
        elif ev.kind == "node.link_up":
            links_down.discard(node)
        elif ev.kind in ("node.suspect", "node.lost"):
            silent.add(node)
        elif ev.kind in ("node.recovered", "node.joined"):
            silent.discard(node)
    return bool(links_down or silent)


def _off_at(events: list[TraceEvent], t_ms: int) -> set[str]:
    """The nodes the log holds lost at `t_ms` (lost, and not registered or heard since)."""
    off: set[str] = set()
    for ev in events:
        if ev.t_ms >= t_ms:
            break
        if ev.kind == "node.lost":
            off.add(str(ev.get("node")))
        elif ev.kind in ("node.joined", "node.recovered"):
            off.discard(str(ev.get("node")))
    return off


def _links(
    window: list[TraceEvent],
    history: list[TraceEvent],
    rel: Clock,
    end_ms: int,
    fabrics: dict[str, tuple[str, ...]],
) -> list[Inferred]:
    """`history`: the log up to the window's end, for which nodes are off at a time."""
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
        up_nodes = set(fabrics.get(fabric, ())) - _off_at(history, ev.t_ms)
        at = ev.t_ms - REPORT_MS
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
    window: list[TraceEvent], before: list[TraceEvent], rel: Clock, t: Timings
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
        died = max(last + 1, began - RESTART_DOWN_MS)
        down = max(0, began - max(died, rel.start_ms))
        note = f"a controller started again at {rel.text(ev.t_ms)}"
        out.append(Inferred(died, "restart_controller", {"down_for": down}, note))
    return out


_OPERATOR = {
    "node.cordoned": "cordon",
    "node.uncordoned": "uncordon",
    "node.draining": "drain",
}


def _operator(window: list[TraceEvent], rel: Clock) -> list[Inferred]:
    out: list[Inferred] = []
    for ev in window:
        lag = ev.get("lag_ms")
        if ev.kind == "controller.lagged" and isinstance(lag, int) and lag > 0:
            note = f"the controller found itself {lag} ms late at {rel.text(ev.t_ms)}"
            value = {"controller": "leader", "for": lag}
            out.append(Inferred(ev.t_ms - lag, "stall_controller", value, note))
    draining = {(ev.t_ms, ev.get("node")) for ev in window if ev.kind == "node.draining"}
    for ev in window:
        note = f"{ev.kind} at {rel.text(ev.t_ms)}: the operator's call"
        if ev.kind in _OPERATOR:
            if ev.kind == "node.cordoned" and (ev.t_ms, ev.get("node")) in draining:
                continue
            out.append(Inferred(ev.t_ms, _OPERATOR[ev.kind], str(ev.get("node")), note))
        elif ev.kind == "deployment.profile_changed":
            value = {"model": ev.get("model"), "profile": ev.get("profile")}
            out.append(Inferred(ev.t_ms, "set_profile", value, note))
        elif ev.kind == "deployment.deleted":
            out.append(Inferred(ev.t_ms, "delete_deployment", str(ev.get("model")), note))
    return out
