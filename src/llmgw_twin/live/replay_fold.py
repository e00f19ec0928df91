"""The fleet as the controller held it at an instant, folded from its event log.

Role: `Fold(fleet)` takes the fleet's nodes, profiles and deployments (a loaded scenario with no
faults) and `apply`s the log's events in order: nodes' health, failed GPUs, cordons, drains and
quarantines; every live replica with its model, profile, state, fabric and nodes; each
deployment's profile and wanted count. `initial(t_ms)` is that state as a scenario's `initial`
section (docs/scenarios.md).

The log names no GPU of a shard: each shard gets the lowest free GPUs of its node when its
replica is placed (or adopted), as the placement picks them (`control/placement.py`: a node's
free GPUs in order, the first `gpus_per_node`); `honour_gpu_failures` then moves them where a
failed GPU in the window says a replica was, or was not (docs/live-twin.md, "Replay").

A wanted count is not in the log: it starts as the fleet's, becomes the live count when a
replica is reaped `scaled down`, and grows when a replica is placed that no failure or move
explains; each change is recorded in `scales` (a `set_replicas` when it falls in the window).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass, field

from llmgw_twin.control.model import TraceEvent
from llmgw_twin.live.replay_log import ReplayError
from llmgw_twin.twin.scenario.model import Scenario
from llmgw_twin.units import fmt_duration


@dataclass(slots=True)
class Rep:
    id: str
    model: str
    profile: str
    state: str  # starting | ready | pending
    fabric: str | None = None
    nodes: tuple[str, ...] = ()
    gpus: dict[str, list[int]] = field(default_factory=dict)


class Fold:
    def __init__(self, fleet: Scenario) -> None:
        self.gpu_count = {str(n.node): n.gpus for n in fleet.nodes}
        self.fabric_of = {str(n.node): str(n.fabric) for n in fleet.nodes}
        self.profiles = {str(p.name): p for p in fleet.profiles}
        self.profile_of = {str(d.model): str(d.profile) for d in fleet.deployments}
        self.wanted = {str(d.model): d.replicas for d in fleet.deployments}
        self.replicas: dict[str, Rep] = {}
        self.state: dict[str, str] = {}
        self.failed: dict[str, set[int]] = {}
        self.free: dict[str, list[int]] = {n: list(range(c)) for n, c in self.gpu_count.items()}
        self.cordoned: set[str] = set()
        self.draining: set[str] = set()
        self.quarantines: dict[tuple[str, str], tuple[int, str]] = {}
        self.copies: set[str] = set()
        self.deleted: set[str] = set()
        self.scales: list[tuple[int, str, int]] = []
        self.now = 0

    # --- checks ---------------------------------------------------------------------------

    def _node(self, ev: TraceEvent) -> str:
        node = str(ev.get("node"))
        if node not in self.gpu_count:
            raise ReplayError(
                f"the log names node {node} (t_ms {ev.t_ms}, {ev.kind}), which the fleet does "
                "not have"
            )
        return node

    def _model(self, ev: TraceEvent) -> str:
        model = str(ev.get("model"))
        if model not in self.profile_of:
            raise ReplayError(
                f"the log names model {model} (t_ms {ev.t_ms}, {ev.kind}), which the fleet does "
                "not deploy"
            )
        return model

    def _known(self, ev: TraceEvent) -> Rep:
        rid = str(ev.get("replica"))
        rep = self.replicas.get(rid)
        if rep is None:
            raise ReplayError(
                f"the log's history is incomplete: replica {rid} appears at t_ms {ev.t_ms} "
                f"({ev.kind}) and was never placed or adopted before"
            )
        return rep

    # --- folding --------------------------------------------------------------------------

    def apply(self, ev: TraceEvent) -> None:
        self.now = ev.t_ms
        kind = ev.kind
        if kind.startswith("node.") or kind.startswith("gpu."):
            self._node_event(kind, self._node(ev), ev)
        elif kind == "deployment.profile_changed":
            self.profile_of[self._model(ev)] = str(ev.get("profile"))
        elif kind == "deployment.deleted":
            self.deleted.add(self._model(ev))
        elif kind.startswith("replica."):
            self._replica_event(kind, ev)

    def _node_event(self, kind: str, node: str, ev: TraceEvent) -> None:
        if kind in ("node.joined", "node.recovered"):
            self.state[node] = "alive"
        elif kind == "node.suspect":
            self.state[node] = "suspect"
        elif kind == "node.lost":
            self.state[node] = "lost"
        elif kind == "node.cordoned":
            self.cordoned.add(node)
        elif kind == "node.uncordoned":
            self.cordoned.discard(node)
            self.draining.discard(node)
        elif kind == "node.draining":
            self.draining.add(node)
            self.cordoned.add(node)
        elif kind == "node.drained":
            self.draining.discard(node)
        elif kind == "node.quarantined":
            key = (node, str(ev.get("profile")))
            self.quarantines[key] = (int(str(ev.get("until_ms"))), str(ev.get("reason") or ""))
        elif kind == "node.unquarantined":
            self.quarantines.pop((node, str(ev.get("profile"))), None)
        elif kind == "gpu.failed":
            gpu = int(str(ev.get("gpu")))
            self.failed.setdefault(node, set()).add(gpu)
            if gpu in self.free[node]:
                self.free[node].remove(gpu)
        elif kind == "gpu.cleared":
            gpu = int(str(ev.get("gpu")))
            self.failed.get(node, set()).discard(gpu)
            if gpu not in self._booked(node):
                bisect.insort(self.free[node], gpu)

    def _booked(self, node: str) -> set[int]:
        return {g for r in self.replicas.values() for g in r.gpus.get(node, ())}

    def _replica_event(self, kind: str, ev: TraceEvent) -> None:
        if kind in ("replica.placed", "replica.adopted"):
            model = self._model(ev)
            rid = str(ev.get("replica"))
            known = self.replicas.get(rid)
            if known is not None and known.state != "pending":
                if kind == "replica.adopted" and ev.get("ready") is True:
                    known.state = "ready"
                return
            rep = Rep(rid, model, self.profile_of[model], "starting")
            if kind == "replica.adopted" and ev.get("ready") is True:
                rep.state = "ready"
            rep.fabric = str(ev.get("fabric"))
            nodes = ev.get("nodes")
            rep.nodes = tuple(str(n) for n in nodes) if isinstance(nodes, tuple) else ()
            self._book(rep, ev)
            self.replicas[rid] = rep
            if kind == "replica.placed" and rid not in self.copies:
                live = self.live_count(model)
                if live > self.wanted[model]:
                    self._scale(model, live)
        elif kind == "replica.unplaceable":
            model = self._model(ev)
            rid = str(ev.get("replica"))
            if rid not in self.replicas:
                self.replicas[rid] = Rep(rid, model, self.profile_of[model], "pending")
                if rid not in self.copies and self.live_count(model) > self.wanted[model]:
                    self._scale(model, self.live_count(model))
        elif kind in ("replica.ready", "replica.recovered"):
            self._known(ev).state = "ready"
        elif kind in ("replica.failed", "replica.reaped"):
            if kind == "replica.failed" or str(ev.get("replica")) in self.replicas:
                rep = self._known(ev)
                self._release(rep)
                self.copies.discard(rep.id)
                if kind == "replica.reaped" and ev.get("reason") == "scaled down":
                    self._scale(rep.model, self.live_count(rep.model))
        elif kind == "replica.moving":
            self.copies.add(str(ev.get("to")))
        elif kind in ("replica.moved", "replica.move_aborted"):
            self.copies.discard(str(ev.get("to")))

    def _scale(self, model: str, count: int) -> None:
        if self.wanted[model] != count:
            self.wanted[model] = count
            if self.scales and self.scales[-1][:2] == (self.now, model):
                self.scales.pop()  # several replicas of one change, in one step
            self.scales.append((self.now, model, count))

    def live_count(self, model: str) -> int:
        return sum(
            1 for r in self.replicas.values() if r.model == model and r.id not in self.copies
        )

    def _book(self, rep: Rep, ev: TraceEvent) -> None:
        profile = self.profiles.get(rep.profile)
        if profile is None:
            raise ReplayError(
                f"replica {rep.id} (t_ms {ev.t_ms}) runs profile {rep.profile}, which the fleet "
                "does not have"
            )
        for node in rep.nodes:
            if node not in self.free:
                raise ReplayError(
                    f"the log places replica {rep.id} on node {node} (t_ms {ev.t_ms}), which the "
                    "fleet does not have"
                )
            free = self.free[node]
            if len(free) < profile.gpus_per_node:
                raise ReplayError(
                    f"the log places replica {rep.id} on node {node} (t_ms {ev.t_ms}) where the "
                    f"fleet has {len(free)} free GPU(s) of the {profile.gpus_per_node} it needs: "
                    "the fleet does not match the log"
                )
            rep.gpus[node] = free[: profile.gpus_per_node]
            del free[: profile.gpus_per_node]

    def _release(self, rep: Rep) -> None:
        del self.replicas[rep.id]
        for node, gpus in rep.gpus.items():
            for g in gpus:
                if g not in self.failed.get(node, ()):
                    bisect.insort(self.free[node], g)

    # --- the initial section --------------------------------------------------------------

    def honour_gpu_failures(self, window: list[TraceEvent]) -> None:
        """A GPU that fails in the window under a replica that fails with it (on that node,
        within 100 ms either side: the engine's exit may be told before the GPU or with it)
        must be one of that replica's; one that fails under none must be free: swap GPUs of
        the node so."""
        for i, ev in enumerate(window):
            if ev.kind != "gpu.failed":
                continue
            node, gpu = str(ev.get("node")), int(str(ev.get("gpu")))
            if node not in self.free:
                continue
            victims = []
            for e in _near(window, i, 100):
                rid = str(e.get("replica"))
                if e.kind == "replica.failed" and e.get("node") == node and rid in self.replicas:
                    victims.append(rid)
            holder = next((r for r in self.replicas.values() if gpu in r.gpus.get(node, ())), None)
            if victims and (holder is None or holder.id not in victims):
                victim = self.replicas[victims[0]]
                mine = victim.gpus.get(node)
                if not mine:
                    continue
                given = mine.pop()
                mine.append(gpu)
                mine.sort()
                if holder is not None:
                    held = holder.gpus[node]
                    held[held.index(gpu)] = given
                    held.sort()
                else:
                    self.free[node].remove(gpu)
                    bisect.insort(self.free[node], given)
            elif not victims and holder is not None and self.free[node]:
                spare = self.free[node].pop(0)
                held = holder.gpus[node]
                held[held.index(gpu)] = spare
                held.sort()
                bisect.insort(self.free[node], gpu)

    def initial(self, at_ms: int) -> dict[str, object]:
        nodes: dict[str, dict[str, object]] = {}
        for node in sorted(self.gpu_count):
            entry: dict[str, object] = {}
            if self.state.get(node) in ("suspect", "lost"):
                entry["state"] = self.state[node]
            if self.failed.get(node):
                entry["failed_gpus"] = sorted(self.failed[node])
            if node in self.draining:
                entry["draining"] = True
            elif node in self.cordoned:
                entry["cordoned"] = True
            if entry:
                nodes[node] = entry
        out: dict[str, object] = {}
        if nodes:
            out["nodes"] = nodes
        quarantines = [
            {"node": n, "profile": p, "for": fmt_duration(until - at_ms), "reason": why}
            for (n, p), (until, why) in sorted(self.quarantines.items())
            if until > at_ms
        ]
        if quarantines:
            out["quarantines"] = quarantines
        reps: list[dict[str, object]] = []
        for rep in sorted(self.replicas.values(), key=lambda r: _id_key(r.id)):
            item: dict[str, object] = {
                "id": rep.id,
                "model": rep.model,
                "profile": rep.profile,
                "state": rep.state,
            }
            if rep.state != "pending":
                item["fabric"] = rep.fabric
                item["shards"] = [
                    {"rank": rank, "node": node, "gpus": list(rep.gpus[node])}
                    for rank, node in enumerate(rep.nodes)
                ]
            reps.append(item)
        if reps:
            out["replicas"] = reps
        return out


def _id_key(rid: str) -> tuple[str, int]:
    model, _, seq = rid.rpartition("-r")
    return (model, int(seq)) if seq.isdigit() else (rid, 0)


def _near(window: list[TraceEvent], i: int, within_ms: int) -> Iterator[TraceEvent]:
    """The events of `window` within `within_ms` of its `i`th, nearest first on each side:
    those before it, then those after."""
    at = window[i].t_ms
    for j in range(i - 1, -1, -1):
        if at - window[j].t_ms > within_ms:
            break
        yield window[j]
    for j in range(i + 1, len(window)):
        if window[j].t_ms - at > within_ms:
            break
        yield window[j]
