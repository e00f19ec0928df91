"""The node registry of the controller core: what each node is, whether it is heard, and what
its health changes mean for the replicas on it.

`NodeRegistry` owns the registered facts of every node, their incarnations, which nodes were
heard since this controller started (only those are placed on), which nodes' silence the store
records, the heartbeat bookkeeping (`HealthTracker`) and the mass-loss guard. It is handed the
controller's shared books and its `Liveness` (whose heartbeat tracker, mass-loss guard and heard
set it alone changes) and fails replicas through the `Lifecycle` it is built with.

Invariants: a node is schedulable only while alive and heard; a node that turns suspect is
written to the store as silent since its last heartbeat, and cleared when heard; while the guard
holds, no node is declared lost; otherwise a node silent past the lost window is declared lost
only within the eviction pace (`pace.EvictionPace`), and stays suspect (`paced`) until then; a
node registering again with other facts first fails every replica it no longer fits.
"""

from __future__ import annotations

from typing import assert_never

from llmgw_twin.control.durable import (
    DeleteNode,
    DeleteSilence,
    PutFailedGpu,
    PutNode,
    PutSilence,
)
from llmgw_twin.control.health import HealthChange
from llmgw_twin.control.lifecycle import Lifecycle
from llmgw_twin.control.model import NodeId, NodeInfo, NodeState, ReplicaState
from llmgw_twin.control.parts import Books, Liveness


class NodeRegistry:
    def __init__(self, books: Books, liveness: Liveness, life: Lifecycle) -> None:
        self.timings = books.timings
        self.capacity = books.capacity
        self.assignments = books.assignments
        self.replicas = books.replicas
        self.failures = books.failures
        self.out = books.out
        self.life = life
        self.health = liveness.health
        self.guard = liveness.guard
        self.heard_nodes = liveness.heard
        """Nodes heard from since this controller started: only these are placed on."""
        self.infos: dict[NodeId, NodeInfo] = {}
        self.incarnations: dict[NodeId, int] = {}
        self.versions: dict[NodeId, tuple[int, int]] = {}
        """The newest report taken from each node: (incarnation, version)."""
        self.silence_marked: set[NodeId] = set()
        """Nodes whose silence the store records (cleared in the store when heard)."""
        self.pace = books.pace
        self.paced: set[NodeId] = set()
        """Nodes due to be declared lost that the eviction pace keeps (`node.loss_paced`)."""

    def register(self, info: NodeInfo, now_ms: int, incarnation: int) -> None:
        known = self.infos.get(info.node)
        if known is not None and known != info:
            self.refit(known, info)
        if known != info:
            self.out.write(PutNode(info))
            self.infos[info.node] = info
            self.capacity.add_node(info)  # new facts: re-indexed, unschedulable until heard
            self.heard_nodes.discard(info.node)
        # a node never seen, or a new agent process on a node seen before, has joined; a
        # known node answering a restarted controller has not
        before = self.incarnations.get(info.node)
        joined = known is None or (before is not None and before != incarnation)
        self.incarnations[info.node] = incarnation
        self.assignments.forget_report(info.node)  # judge its report afresh
        self.assignments.track(info.node)
        if joined and before is not None:
            self.capacity.stability.mark(info.node, "rebooted", now_ms)
        if joined:
            self.out.emit("node.joined", node=info.node, fabric=info.fabric)
        self.hear(info.node, now_ms, announce=not joined)
        self.assignments.dirty.add(info.node)

    def stale(self, node: NodeId, incarnation: int, version: int) -> bool:
        """A report older than one already taken from the same agent process (delayed on the
        way): it says the node is alive, and nothing else that is still true."""
        got = self.versions.get(node)
        return version > 0 and got is not None and got[0] == incarnation and version < got[1]

    def took(self, node: NodeId, incarnation: int, version: int) -> None:
        """A report of `version` was taken as the node's word."""
        got = self.versions.get(node)
        if version > 0 and (got is None or got[0] != incarnation or got[1] < version):
            self.versions[node] = (incarnation, version)

    def forget_long_lost(self, now_ms: int) -> None:
        """A node lost for `forget_lost_after` and holding nothing leaves every structure and
        the store: a long-lived controller's memory follows the fleet, not its history."""
        for node in self.health.lost_since(now_ms, self.timings.forget_lost_after_ms):
            if self.assignments.keys(node):
                continue
            fabric = self.infos[node].fabric
            self.health.forget(node)
            self.capacity.remove_node(node)
            self.assignments.forget(node)
            self.failures.forget_node(node)
            self.infos.pop(node, None)
            self.incarnations.pop(node, None)
            self.versions.pop(node, None)
            self.heard_nodes.discard(node)
            self.silence_marked.discard(node)
            self.paced.discard(node)
            self.out.write(DeleteNode(node))
            self.out.emit("node.forgotten", node=node, fabric=fabric)

    def refit(self, known: NodeInfo, info: NodeInfo) -> None:
        """A node registered again with other facts: a replica it no longer fits (another
        fabric, GPUs it lost, an engine it no longer has) is failed before the node is
        re-indexed, so no replica spans two fabrics or holds GPUs that are not there; room a
        defragmentation held there that is gone voids its plan."""
        if self.life.moves.refit(info.node, info.gpus, info.fabric != known.fabric):
            self.life.placement_may_fit()
        for rid in self.assignments.replicas_on(info.node):
            rec = self.replicas[rid]
            mine = [s for s in rec.specs if s.node == info.node]
            why = []
            if rec.fabric is not None and info.fabric != rec.fabric:
                why.append(f"now in fabric {info.fabric}")
            if any(g >= info.gpus for s in mine for g in s.gpus):
                why.append(f"now has {info.gpus} GPU(s)")
            if rec.profile.engine not in info.engines:
                why.append(f"no longer runs {rec.profile.engine}")
            if why:
                reason = f"node {info.node} registered again: {', '.join(why)}"
                self.life.fail(rec, reason, info.node)

    def gpus_failed(self, node: NodeId, gpus: tuple[int, ...]) -> None:
        """A failed GPU is never offered again, across restarts, until an operator clears it; a
        live replica on it fails at once."""
        for gpu in gpus:
            if not self.capacity.fail_gpu(node, gpu):
                continue
            self.out.write(PutFailedGpu(node, gpu))
            self.out.emit("gpu.failed", node=node, gpu=gpu)
            self.life.placement_may_fit()
            for spec in self.assignments.of(node):
                rec = self.replicas.get(spec.replica)
                if gpu in spec.gpus and rec is not None and rec.state.live:
                    self.life.fail(rec, f"GPU {gpu} failed on {node}", node)

    def link(self, node: NodeId, up: bool) -> None:
        """The node's fabric link state: a node whose links are down takes no multi-node shard."""
        if not self.capacity.set_link_up(node, up):
            return
        fabric = self.infos[node].fabric
        self.out.emit("node.link_up" if up else "node.link_down", node=node, fabric=fabric)
        if up:
            self.life.placement_may_fit()

    def judge_mass_loss(self, now_ms: int) -> None:
        alive, suspect = self.health.alive_count, self.health.suspect_count
        guard = self.guard
        guard.settle(alive, suspect)
        if guard.should_hold(alive, suspect):
            # the hold began when the silence tipped over the share (long ago, for a controller
            # restored mid-hold: the store kept every node's silence)
            tipped = self.health.nth_silence(guard.tipping_index(alive, suspect))
            since = now_ms if tipped is None else tipped + self.timings.node_suspect_after_ms
            guard.hold(min(since, now_ms), alive, suspect)
            self.out.emit(
                "fleet.hold",
                silent=suspect,
                fleet=alive + suspect,
                reason=f"{suspect} of {alive + suspect} nodes silent at once: taken for the "
                "controller's own partition; nothing is failed or reaped for silence",
            )
            for node in self.health.suspects():
                for rid in self.assignments.replicas_on(node):
                    self.life.reroute(self.replicas[rid], None, "mass-loss hold keeps routes")
        elif guard.should_resume(alive):
            guard.resume()
            silent = self.health.restart_silence(now_ms)
            self.out.emit("fleet.resumed", heard=alive, fleet=guard.fleet, silent=len(silent))
            for node in silent:
                self.out.write(PutSilence(node, now_ms))  # silence counts from now
                self.silence_marked.add(node)
                for rid in self.assignments.replicas_on(node):
                    self.life.unroute(self.replicas[rid], node)
        if guard.should_accept(now_ms):
            self.accept_loss(now_ms, alive, suspect)

    def accept_loss(self, now_ms: int, alive: int, suspect: int) -> None:
        """The hold ran out: the silent nodes' replicas leave routing (and no longer count as
        ready), and the nodes are declared lost at the eviction pace from this tick on."""
        guard = self.guard
        held_s = (now_ms - guard.since_ms) // 1000
        guard.accept()
        self.out.emit(
            "fleet.loss_accepted",
            silent=suspect,
            fleet=alive + suspect,
            held_ms=now_ms - guard.since_ms,
            reason=f"{suspect} of {alive + suspect} nodes silent for {held_s}s, past the "
            f"mass-loss hold's bound of {self.timings.mass_loss_hold_max_ms // 1000}s: taken "
            "as lost, declared lost at the eviction pace",
        )
        for node in self.health.suspects():
            for rid in self.assignments.replicas_on(node):
                rec = self.replicas[rid]
                self.life.unroute(rec, node)
                if rec.state is ReplicaState.ADOPTING:
                    self.replicas.dirty_models.add(rec.model)  # no longer counted

    def expire_lost(self, now_ms: int) -> list[NodeId]:
        """Declare lost every node silent for the lost window, as far as the eviction pace
        allows (oldest silence first; a node's cost is its live replicas); the others stay
        suspect, their replicas kept out of routing and not replaced, and are tried again at
        the next tick (`node.loss_paced` once per node). Returns the nodes declared lost."""
        lost: list[NodeId] = []
        pace = self.pace
        for node in self.health.overdue(now_ms):
            fabric = self.infos[node].fabric
            live = [r for r in self.assignments.replicas_on(node) if self.replicas[r].state.live]
            cost = {fabric: len(live)}
            if not pace.take(cost, now_ms):
                if node not in self.paced:
                    self.paced.add(node)
                    window_s = self.timings.eviction_window_ms // 1000
                    self.out.emit(
                        "node.loss_paced",
                        node=node,
                        fabric=fabric,
                        replicas=len(live),
                        reason=f"silent past the lost window; declaring it lost would take "
                        f"down {len(live)} replica(s) beyond the eviction budget of "
                        f"{self.timings.eviction_budget} per {window_s}s (fabric: "
                        f"{self.timings.eviction_fabric_budget}): kept until the budget allows",
                    )
                continue
            self.paced.discard(node)
            self.on_health(self.health.declare_lost(node))
            lost.append(node)
        return lost

    def hear_quiet(
        self, node: NodeId, now_ms: int, fabric_up: bool, failed_gpus: tuple[int, ...]
    ) -> bool:
        """The usual heartbeat: a node alive and heard, nothing of its silence in the store, the
        same link state and no GPU failed that is not known failed. Then it is heard (`hear` would
        do just that) and True; otherwise nothing is done and False."""
        if node in self.silence_marked or node not in self.heard_nodes:
            return False
        if self.capacity.link_up(node) != fabric_up:
            return False
        if failed_gpus and not set(failed_gpus).issubset(self.capacity.failed_gpus(node)):
            return False
        if not self.health.heard_alive(node, now_ms):
            return False
        if self.failures.heard(node, now_ms):
            self.life.placement_may_fit()
        return True

    def settled(self, node: NodeId) -> bool:
        """Nothing waits on the node's next heartbeat: none of its failures waits to be lifted by
        it, its assignment is unchanged since the last tick, and it is not out of sync."""
        return not self.failures.waits_on(node) and node not in self.assignments.dirty

    def hear(self, node: NodeId, now_ms: int, announce: bool = True) -> None:
        """A node spoke: it is alive, and once heard it may be placed on."""
        change = self.health.seen(node, now_ms)
        self.paced.discard(node)
        if node in self.silence_marked:
            self.silence_marked.discard(node)
            self.out.write(DeleteSilence(node))
        if self.failures.heard(node, now_ms):
            self.life.placement_may_fit()
        if node not in self.heard_nodes:
            self.heard_nodes.add(node)
            self.capacity.set_schedulable(node, True)
            self.life.placement_may_fit()
        self.on_health(change, announce)

    def on_health(self, change: HealthChange | None, announce: bool = True) -> None:
        """Act on a node's health changing."""
        if change is None or change.before is None:
            return
        node, fabric = change.node, self.infos[change.node].fabric
        match change.after:
            case NodeState.ALIVE:
                if announce:
                    self.out.emit("node.recovered", node=node, fabric=fabric)
                self.capacity.set_schedulable(node, True)
                self.life.placement_may_fit()
                self.assignments.dirty.add(node)
                for rid in self.assignments.replicas_on(node):
                    self.life.reroute(self.replicas[rid], node, f"node {node} heard again")
            case NodeState.SUSPECT:
                self.out.emit("node.suspect", node=node, fabric=fabric)
                self.capacity.stability.mark(node, "unheard", self.out.now_ms)
                self.capacity.set_schedulable(node, False)
                since = self.health.last_seen_ms(node)
                if since is not None and node not in self.silence_marked:
                    self.out.write(PutSilence(node, since))
                    self.silence_marked.add(node)
                for rid in self.assignments.replicas_on(node):
                    rec = self.replicas[rid]
                    if not self.guard.held:
                        self.life.unroute(rec, node)
            case NodeState.LOST:
                self.out.emit("node.lost", node=node, fabric=fabric)
                self.capacity.stability.mark(node, "lost", self.out.now_ms)
                self.capacity.set_schedulable(node, False)
                for rid in self.assignments.replicas_on(node):
                    self.life.fail(self.replicas[rid], f"node {node} lost", node)
                since = self.health.last_seen_ms(node)
                if since is not None:  # a peer's exit when the node went was the node's doing
                    self.life.timers.forgive(node, since, f"node {node} lost")
            case _:
                assert_never(change.after)
