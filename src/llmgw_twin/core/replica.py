"""A replica as the controller keeps it: placement, shard specs, state, and what agents report.

`ReplicaRecord` is the controller's only mutable per-replica state. Its `readiness` is derived
from the agents' latest reports alone (level-triggered): a replica is ready exactly when every
rank is reported running (workers) or serving (the leader, with an endpoint) on the node it was
placed on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmgw_twin.core.model import (
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

    @property
    def shard_count(self) -> int:
        return self.profile.nodes

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
