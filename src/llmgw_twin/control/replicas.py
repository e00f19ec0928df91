"""The controller's replicas: each one's record, and the table that indexes them.

`ReplicaRecord` is the controller's only mutable per-replica state; its state moves only through
`move()`, checked against `states.REPLICA`. Its readiness is derived from the agents' latest
reports alone (level-triggered): a replica is whole exactly when every rank is reported running
(workers) or serving (the leader, with an endpoint) on the node it was placed on.

`ReplicaTable` owns every record and the indexes over them: live replicas per model in creation
order, the pending ones, the restored ones still in adoption, live placed replicas per model and
fabric, the per-model id counters, a bounded history of reaped ones, and what the next tick must
look at (dirty replicas and models).

Invariants: `by_model` holds exactly the live replicas; `pending` exactly the live unplaced ones;
`per_fabric[model][f]` counts the live placed replicas of `model` in `f`, `per_node[model][n]`
those with a shard on `n`; ids are never reused
(`seq` only grows, and is written durably before an id is handed out).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from llmgw_twin.control import states
from llmgw_twin.control.model import (
    FabricId,
    ModelName,
    NodeId,
    Profile,
    ReplicaId,
    ReplicaState,
    ShardReport,
    ShardSpec,
    ShardState,
)

REAPED_KEPT = 1024
"""How many reaped replicas the controller still answers for (the oldest are forgotten first):
a fleet that fails for months must not grow without bound."""


@dataclass(slots=True)
class ReplicaRecord:
    id: ReplicaId
    model: ModelName
    profile: Profile
    seq: int
    """Per-model creation number: replica ids are `{model}-r{seq}`."""
    created_ms: int
    state: ReplicaState = ReplicaState.PENDING
    fabric: FabricId | None = None
    specs: tuple[ShardSpec, ...] = ()
    """One per rank once placed; `specs[0]` is the leader."""
    reports: dict[int, ShardReport] = field(default_factory=dict)
    """rank -> the latest report from the node that rank was placed on."""
    unplaceable_reason: str | None = None
    endpoint: str | None = None
    not_before_ms: int = 0
    """A replacement in back-off is not placed before this time."""
    unroutable: frozenset[NodeId] = frozenset()
    """Suspect nodes this ready replica has a shard on: while any, it is out of routing."""
    layout_shards: int = 0
    """How many shards this replica was laid out with (its row's `shard_count` once restored):
    a profile edited since does not change what this replica is."""
    degraded_since_ms: int = 0
    group: str = ""
    """Its role group (`control/groups.py`); empty: a plain replica."""
    role: str = ""
    """Its role in that group (`prefill`, `decode`)."""

    @property
    def tags(self) -> dict[str, str]:
        """A grouped replica's group and role, for its events (none for a plain replica)."""
        return {"group": self.group, "role": self.role} if self.group else {}

    @property
    def routed_endpoint(self) -> str | None:
        """The leader endpoint an event may announce to the router: none while a node of this
        replica is suspect (`Lifecycle.reroute` announces it once every node is heard)."""
        return self.endpoint if not self.unroutable else None

    def move(self, new: ReplicaState) -> None:
        """Change state along the replica table; an illegal move raises."""
        self.state = states.transition(states.REPLICA, self.state, new)

    @property
    def shard_count(self) -> int:
        return self.layout_shards or self.profile.nodes

    @property
    def nodes(self) -> tuple[NodeId, ...]:
        return tuple(s.node for s in self.specs)

    @property
    def placed(self) -> bool:
        return bool(self.specs)

    def whole(self) -> bool:
        """Every rank reported up, and the leader serving with an endpoint."""
        if len(self.specs) != self.shard_count or len(self.reports) != self.shard_count:
            return False
        for rank, report in self.reports.items():
            want = ShardState.SERVING if rank == 0 else ShardState.RUNNING
            if report.state is not want:
                return False
        return self.reports[0].endpoint is not None


class ReplicaTable:
    def __init__(self) -> None:
        self.records: dict[ReplicaId, ReplicaRecord] = {}
        self.by_model: dict[ModelName, dict[ReplicaId, None]] = {}  # live, creation order
        self.pending: dict[ReplicaId, None] = {}  # creation order
        self.unready: dict[ReplicaId, None] = {}
        """Placed (or adopted) replicas not yet ready, each with a start deadline."""
        self.adopting: set[ReplicaId] = set()
        self.seqs: dict[ModelName, int] = {}
        self._per_fabric: dict[ModelName, dict[FabricId, int]] = {}
        self._per_node: dict[ModelName, dict[NodeId, int]] = {}
        self._reaped: deque[ReplicaId] = deque()
        # what the next tick must look at
        self.dirty: set[ReplicaId] = set()
        self.dirty_models: set[ModelName] = set()

    def get(self, rid: ReplicaId) -> ReplicaRecord | None:
        return self.records.get(rid)

    def __getitem__(self, rid: ReplicaId) -> ReplicaRecord:
        return self.records[rid]

    def sorted(self) -> list[ReplicaRecord]:
        return [self.records[r] for r in sorted(self.records)]

    def live(self, model: ModelName) -> list[ReplicaRecord]:
        return [self.records[r] for r in self.by_model.get(model, {})]

    def per_fabric(self, model: ModelName) -> dict[FabricId, int]:
        """Live placed replicas of `model` per fabric (kept up to date by bind and reap)."""
        return self._per_fabric.setdefault(model, {})

    def per_node(self, model: ModelName) -> dict[NodeId, int]:
        """Live placed replicas of `model` with a shard on each node (kept like `per_fabric`)."""
        return self._per_node.setdefault(model, {})

    def track_model(self, model: ModelName) -> None:
        self.by_model.setdefault(model, {})
        self.dirty_models.add(model)

    # --- changes -----------------------------------------------------------------------------

    def next_id(self, model: ModelName) -> tuple[ReplicaId, int]:
        seq = self.seqs.get(model, 0) + 1
        self.seqs[model] = seq
        return ReplicaId(f"{model}-r{seq}"), seq

    def add(self, rec: ReplicaRecord) -> None:
        """A new replica (pending) or a restored one (adopting, already placed)."""
        self.records[rec.id] = rec
        self.by_model.setdefault(rec.model, {})[rec.id] = None
        if rec.state is ReplicaState.PENDING:
            self.pending[rec.id] = None
        elif rec.state is ReplicaState.ADOPTING:
            self.adopting.add(rec.id)
        if rec.placed and rec.fabric is not None:
            self._count(rec, +1)

    def placed(self, rec: ReplicaRecord) -> None:
        """A pending replica was bound to its nodes."""
        del self.pending[rec.id]
        self._count(rec, +1)

    def reaped(self, rec: ReplicaRecord) -> None:
        """A replica left for good: out of every index, kept in the bounded history."""
        if rec.fabric is not None and rec.placed:
            self._count(rec, -1)
        self.adopting.discard(rec.id)
        self.unready.pop(rec.id, None)
        self.dirty.discard(rec.id)
        self.pending.pop(rec.id, None)
        self.by_model.get(rec.model, {}).pop(rec.id, None)
        self.dirty_models.add(rec.model)
        self._reaped.append(rec.id)
        if len(self._reaped) > REAPED_KEPT:  # keep recent history, not all of it
            self.records.pop(self._reaped.popleft(), None)

    def _count(self, rec: ReplicaRecord, delta: int) -> None:
        assert rec.fabric is not None
        per_fabric = self.per_fabric(rec.model)
        per_fabric[rec.fabric] = per_fabric.get(rec.fabric, 0) + delta
        per_node = self.per_node(rec.model)
        for node in rec.nodes:
            left = per_node.get(node, 0) + delta
            if left:
                per_node[node] = left
            else:
                per_node.pop(node, None)
