"""What a router learns from the controller: the event kinds that change its table, and the
snapshot a controller gives a router that (re)joins its stream (`routing.Router.resync`).

Pure values: the controller core builds the snapshot from its records (`snapshot_of`); the
services carry both over HTTP (`service/common/feed.py`); the twin hands them over directly.
A role group's member (`control/groups.py`) carries its group and role, so a router can pick
prefill then decode within one group.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from llmgw_twin.control.model import ModelName, ReplicaId, ReplicaState
from llmgw_twin.control.replicas import ReplicaRecord

JOINS = frozenset({"replica.ready", "replica.adopted", "replica.recovered", "replica.routable"})
LEAVES = frozenset({"replica.failed", "replica.reaped", "replica.degraded", "replica.unroutable"})
FEED_KINDS = JOINS | LEAVES
"""The event kinds a router needs from the controller's stream."""


class SnapshotState(StrEnum):
    READY = "ready"  # routable now, at `endpoint`
    ADOPTING = "adopting"  # restored by a new controller, not yet judged


@dataclass(frozen=True, slots=True)
class SnapshotEntry:
    """One replica in a controller's routing snapshot."""

    model: ModelName
    replica: ReplicaId
    state: SnapshotState
    endpoint: str | None = None
    group: str = ""
    role: str = ""


def snapshot_of(records: Iterable[ReplicaRecord]) -> tuple[SnapshotEntry, ...]:
    """What a controller tells a router that (re)joins its stream: its routable replicas, and
    the ones it restored and has not judged yet while none of their nodes is silent. Every other
    replica is out of routing."""
    out = []
    for rec in records:
        if rec.state is ReplicaState.READY and rec.routed_endpoint is not None:
            state = SnapshotState.READY
            out.append(
                SnapshotEntry(rec.model, rec.id, state, rec.routed_endpoint, rec.group, rec.role)
            )
        elif rec.state is ReplicaState.ADOPTING and not rec.unroutable:
            state = SnapshotState.ADOPTING
            out.append(SnapshotEntry(rec.model, rec.id, state, rec.endpoint, rec.group, rec.role))
    out.sort(key=lambda e: e.replica)
    return tuple(out)
