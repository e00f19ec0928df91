"""Invariants, checked after every controller step and once more at the end of a run.

The checkers judge the controller against ground truth the twin holds independently: the fabric
each node really is in (from the scenario), which engine really holds which GPU (the world), and
the last report each agent really delivered. Per step they look only at what the step touched
(replicas named in its events, replicas on the nodes it heard from or changed), so a check costs
what the step cost; `at_end` sweeps everything once.
"""

from __future__ import annotations

from collections.abc import Iterable

from llmgw_twin.control.controller import Controller
from llmgw_twin.control.model import (
    ROLE_NAMES,
    FabricId,
    NodeId,
    NodeState,
    ReplicaId,
    ReplicaState,
    ShardKey,
    ShardReport,
    ShardState,
    TraceEvent,
)
from llmgw_twin.control.protocol import Heartbeat, NodeRegistered
from llmgw_twin.control.replicas import ReplicaRecord
from llmgw_twin.twin.scenario.model import INVARIANTS, Scenario
from llmgw_twin.twin.world.sim import World


class Invariants:
    def __init__(self, scenario: Scenario, world: World) -> None:
        self._fabric_of: dict[NodeId, FabricId] = {n.node: n.fabric for n in scenario.all_nodes}
        self._world = world
        self.violations: dict[str, list[str]] = {name: [] for name in INVARIANTS}
        self.checks: dict[str, int] = dict.fromkeys(INVARIANTS, 0)
        self._delivered: dict[NodeId, dict[ShardKey, ShardReport]] = {}
        self._last: dict[NodeId, tuple[ShardReport, ...]] = {}
        self._version: dict[NodeId, tuple[int, int]] = {}
        """The newest report delivered per node: (incarnation, version)."""
        self._booked: dict[tuple[NodeId, int], ReplicaId] = {}
        self._slots: dict[ReplicaId, list[tuple[NodeId, int]]] = {}
        self._epoch_seen: dict[tuple[NodeId, int], int] = {}
        self._committer: dict[int, str] = {}

    def _fail(self, name: str, t_ms: int, message: str) -> None:
        if len(self.violations[name]) < 50:  # enough to debug; a run stays bounded in memory
            self.violations[name].append(f"t={t_ms}ms {message}")

    # --- one_epoch_acts: a deposed leader never acts ------------------------------------------

    def committed(self, controller: str, epoch: int, t_ms: int) -> None:
        """A controller's step was committed in `epoch`: no other may commit in it."""
        self.checks["one_epoch_acts"] += 1
        first = self._committer.setdefault(epoch, controller)
        if first != controller:
            self._fail(
                "one_epoch_acts", t_ms, f"{controller} committed in epoch {epoch} of {first}"
            )

    def agent_command(
        self, node: NodeId, incarnation: int, epoch: int, refused: bool, t_ms: int
    ) -> None:
        """An agent process acted on (or refused) a command of `epoch`: it must never act on
        one older than the newest it has seen (a new agent process has seen none)."""
        self.checks["one_epoch_acts"] += 1
        key = (node, incarnation)
        seen = self._epoch_seen.get(key, 0)
        if not refused and epoch < seen:
            self._fail(
                "one_epoch_acts", t_ms, f"{node} acted on epoch {epoch} after seeing epoch {seen}"
            )
        self._epoch_seen[key] = max(seen, epoch)

    def delivered(self, msg: Heartbeat | NodeRegistered) -> bool:
        """Record what an agent actually told the controller (ground truth for readiness);
        False when it repeats the node's last report word for word, or is older than a report
        of the same agent process delivered before it (late: it tells nothing still true)."""
        node = msg.node if isinstance(msg, Heartbeat) else msg.info.node
        got = self._version.get(node)
        if msg.version > 0:
            if got is not None and (msg.incarnation, msg.version) < got:
                return False  # a late report, or one of an agent process since replaced
            self._version[node] = (msg.incarnation, msg.version)
        if self._last.get(node) == msg.shards and isinstance(msg, Heartbeat):
            return False
        self._last[node] = msg.shards
        self._delivered.pop(node, None)  # indexed when a check reads it (`_reported`)
        return True

    def _reported(self, node: NodeId) -> dict[ShardKey, ShardReport]:
        """What `node` last told the controller it runs, by shard."""
        got = self._delivered.get(node)
        if got is None:
            got = self._delivered[node] = {r.spec.key: r for r in self._last.get(node, ())}
        return got

    def after_step(
        self, ctl: Controller, t_ms: int, events: Iterable[TraceEvent], heard: NodeId | None
    ) -> None:
        replicas: set[ReplicaId] = set()
        nodes: set[NodeId] = {heard} if heard is not None else set()
        for ev in events:
            rid, node = ev.get("replica"), ev.get("node")
            if isinstance(rid, str):
                replicas.add(ReplicaId(rid))
            if isinstance(node, str):
                nodes.add(NodeId(node))
            if ev.kind == "replica.placed" and isinstance(rid, str):
                self._check_placed(ctl, t_ms, ReplicaId(rid))
            elif ev.kind == "replica.reaped" and isinstance(rid, str):
                self._unbook(ReplicaId(rid))
        for node in sorted(nodes):
            replicas.update(ctl.replicas_on(node))
        for rid in sorted(replicas):
            rec = ctl.replica(rid)
            if rec is not None and rec.state is ReplicaState.READY:
                self._check_ready(ctl, t_ms, rec)
        for message in self._world.gpu_violations:
            self._fail("gpu_exclusive", t_ms, message)
        self._world.gpu_violations.clear()

    def _check_placed(self, ctl: Controller, t_ms: int, rid: ReplicaId) -> None:
        rec = ctl.replica(rid)
        if rec is None:
            return
        self.checks["single_fabric"] += 1
        fabrics = sorted({self._fabric_of[n] for n in rec.nodes})
        if len(fabrics) != 1 or fabrics[0] != rec.fabric:
            self._fail("single_fabric", t_ms, f"{rid} has shards in {', '.join(fabrics)}")
        self.checks["gpu_exclusive"] += 1
        for spec in rec.specs:
            for g in spec.gpus:
                other = self._booked.get((spec.node, g))
                if other is not None and other != rid:
                    self._fail(
                        "gpu_exclusive", t_ms, f"GPU {g} of {spec.node} booked by {other} and {rid}"
                    )
                self._booked[(spec.node, g)] = rid
                self._slots.setdefault(rid, []).append((spec.node, g))

    def _unbook(self, rid: ReplicaId) -> None:
        for slot in self._slots.pop(rid, []):
            if self._booked.get(slot) == rid:
                del self._booked[slot]

    def _check_ready(self, ctl: Controller, t_ms: int, rec: ReplicaRecord) -> None:
        self.checks["ready_is_whole"] += 1
        problems: list[str] = []
        if len(rec.specs) != rec.profile.nodes:
            problems.append(f"{len(rec.specs)} of {rec.profile.nodes} shards placed")
        for spec in rec.specs:
            if ctl.node_state(spec.node) is NodeState.LOST:
                problems.append(f"rank {spec.rank} is on lost node {spec.node}")
                continue
            report = self._reported(spec.node).get(spec.key)
            want = ShardState.SERVING if spec.rank == 0 else ShardState.RUNNING
            if report is None or report.state is not want:
                seen = "nothing" if report is None else report.state.value
                problems.append(f"rank {spec.rank} on {spec.node} is {seen}, not {want.value}")
            elif spec.rank == 0 and report.endpoint is None:
                problems.append("the leader has no endpoint")
        if problems:
            self._fail("ready_is_whole", t_ms, f"{rec.id} ready but " + "; ".join(problems))

    def routed(self, ctl: Controller, t_ms: int, rid: ReplicaId) -> None:
        self.checks["routes_to_ready"] += 1
        rec = ctl.replica(rid)
        if rec is None or rec.state is not ReplicaState.READY:
            state = "unknown" if rec is None else rec.state.value
            self._fail("routes_to_ready", t_ms, f"router picked {rid}, which is {state}")

    def at_end(self, ctl: Controller, t_ms: int) -> None:
        for rec in ctl.replicas():
            if rec.state.live and rec.placed:
                self._check_placed(ctl, t_ms, rec.id)
            if rec.state is ReplicaState.READY:
                self._check_ready(ctl, t_ms, rec)
        self.checks["no_orphans"] += 1
        for message in group_orphans(ctl.replicas()):
            self._fail("no_orphans", t_ms, message)
        for engine in self._world.engines():
            owner = ctl.replica(engine.key.replica)
            wanted = (
                owner is not None
                and owner.state.live
                and engine.key.rank < len(owner.specs)
                and owner.specs[engine.key.rank].node == engine.spec.node
            )
            if not wanted:
                self._fail(
                    "no_orphans",
                    t_ms,
                    f"{engine.spec.node} still runs {engine.key.replica}/{engine.key.rank}, "
                    "which no wanted replica claims",
                )


def group_orphans(records: Iterable[ReplicaRecord]) -> list[str]:
    """Role groups left holding resources for a partner that is gone: a group with a placed
    member but a role with none placed, or members in two fabrics (`control/groups.py`)."""
    groups: dict[str, list[ReplicaRecord]] = {}
    for rec in records:
        if rec.group and rec.state.live:
            groups.setdefault(rec.group, []).append(rec)
    out = []
    for gid, members in sorted(groups.items()):
        placed = [m for m in members if m.placed]
        if not placed:
            continue
        fabrics = sorted({str(m.fabric) for m in placed})
        if len(fabrics) > 1:
            out.append(f"group {gid} has members in {', '.join(fabrics)}")
        held = {m.role for m in placed}
        for role in [r for r in ROLE_NAMES if r not in held]:
            out.append(f"group {gid} holds {', '.join(m.id for m in placed)} but no {role}")
    return out
