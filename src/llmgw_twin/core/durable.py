"""What the controller keeps durably, as data: records, writes, and the state they add up to.

The controller core decides which writes a step makes and returns them in its `Step`; the shell
commits them in one transaction (`control.store`) before it carries out any of the step's
commands, so nothing is ever sent for a decision that a crash could forget. Only what cannot be
observed is kept: desired state (profiles, deployments), the node registry, where each live
replica was placed (with the exact shard specs its agents hold), and the replica-id counters.
Health and readiness are not kept: a restarted controller observes them again.

`DurableState.apply` is the reference semantics of every write; the SQLite store must agree with
it (a property test checks that it does, across reopening).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import assert_never

from llmgw_twin.core.model import (
    Deployment,
    FabricId,
    ModelName,
    NodeId,
    NodeInfo,
    Profile,
    ProfileName,
    ReplicaId,
    ShardSpec,
)


@dataclass(frozen=True, slots=True)
class ReplicaRow:
    """A live, placed replica: enough to recognise its shards after a restart."""

    id: ReplicaId
    model: ModelName
    profile: ProfileName
    seq: int
    created_ms: int
    fabric: FabricId
    shard_count: int
    specs: tuple[ShardSpec, ...]


@dataclass(frozen=True, slots=True)
class PutProfile:
    profile: Profile


@dataclass(frozen=True, slots=True)
class PutDeployment:
    deployment: Deployment


@dataclass(frozen=True, slots=True)
class PutNode:
    info: NodeInfo


@dataclass(frozen=True, slots=True)
class PutReplica:
    row: ReplicaRow


@dataclass(frozen=True, slots=True)
class DeleteReplica:
    replica: ReplicaId


@dataclass(frozen=True, slots=True)
class PutSeq:
    """The last replica number handed out for `model`; ids are never reused."""

    model: ModelName
    seq: int


Write = PutProfile | PutDeployment | PutNode | PutReplica | DeleteReplica | PutSeq


@dataclass(frozen=True, slots=True)
class DurableState:
    """Everything the store holds, each collection sorted by key."""

    profiles: tuple[Profile, ...] = ()
    deployments: tuple[Deployment, ...] = ()
    nodes: tuple[NodeInfo, ...] = ()
    replicas: tuple[ReplicaRow, ...] = ()
    seqs: tuple[tuple[ModelName, int], ...] = field(default=())

    def apply(self, writes: tuple[Write, ...] | list[Write]) -> DurableState:
        profiles = {p.name: p for p in self.profiles}
        deployments = {d.model: d for d in self.deployments}
        nodes = {n.node: n for n in self.nodes}
        replicas = {r.id: r for r in self.replicas}
        seqs = dict(self.seqs)
        for w in writes:
            match w:
                case PutProfile(profile=p):
                    profiles[p.name] = p
                case PutDeployment(deployment=d):
                    deployments[d.model] = d
                case PutNode(info=n):
                    nodes[n.node] = n
                case PutReplica(row=r):
                    replicas[r.id] = r
                case DeleteReplica(replica=rid):
                    replicas.pop(rid, None)
                case PutSeq(model=m, seq=s):
                    seqs[m] = s
                case _:
                    assert_never(w)
        return replace(
            self,
            profiles=tuple(profiles[k] for k in sorted(profiles)),
            deployments=tuple(deployments[k] for k in sorted(deployments)),
            nodes=tuple(nodes[k] for k in sorted(nodes)),
            replicas=tuple(replicas[k] for k in sorted(replicas)),
            seqs=tuple(sorted(seqs.items())),
        )

    def node_ids(self) -> list[NodeId]:
        return [n.node for n in self.nodes]
