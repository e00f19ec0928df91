"""What the controller keeps durably, as data: records, writes, and the state they add up to.

The controller core decides which writes a step makes and returns them in its `Step`; the shell
commits them in one transaction (`store/sqlite.py`) before it carries out any of the step's
commands, so nothing is ever sent for a decision that a crash could forget. Only what cannot be
observed is kept: desired state (profiles, deployments), the node registry, where each live
replica was placed (with the exact shard specs its agents hold), and the replica-id counters.
Readiness is not kept: a restarted controller observes it again. Of health, only what a restart
would otherwise forget is kept: failed GPUs (a rebooted node may report them healthy), node
quarantines, and since when each node has been silent together with the controller's last known
time (so a controller that restarts often still declares a dead node lost in bounded time).

`DurableState.apply` is the reference semantics of every write; the SQLite store must agree with
it (a property test checks that it does, across reopening).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import assert_never

from llmgw_twin.control.model import (
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
class QuarantineRow:
    """`node` takes no shard of `profile` until `until_ms` (or an operator clears it)."""

    node: NodeId
    profile: ProfileName
    until_ms: int
    reason: str


@dataclass(frozen=True, slots=True)
class PutProfile:
    profile: Profile


@dataclass(frozen=True, slots=True)
class PutDeployment:
    deployment: Deployment


@dataclass(frozen=True, slots=True)
class DeleteDeployment:
    """The operator deleted the deployment: its replicas are retired."""

    model: ModelName


@dataclass(frozen=True, slots=True)
class PutNode:
    info: NodeInfo


@dataclass(frozen=True, slots=True)
class DeleteNode:
    """Forget a node: its registry entry, failed GPUs, silence and quarantines."""

    node: NodeId


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


@dataclass(frozen=True, slots=True)
class PutFailedGpu:
    node: NodeId
    gpu: int


@dataclass(frozen=True, slots=True)
class DeleteFailedGpu:
    node: NodeId
    gpu: int


@dataclass(frozen=True, slots=True)
class PutSilence:
    """`node` has not been heard since `since_ms`."""

    node: NodeId
    since_ms: int


@dataclass(frozen=True, slots=True)
class DeleteSilence:
    node: NodeId


@dataclass(frozen=True, slots=True)
class PutQuarantine:
    row: QuarantineRow


@dataclass(frozen=True, slots=True)
class DeleteQuarantine:
    node: NodeId
    profile: ProfileName


@dataclass(frozen=True, slots=True)
class PutCordon:
    """The operator cordoned `node` (nothing new is placed on it); `draining`: and its replicas
    are moved off it, make-before-break."""

    node: NodeId
    draining: bool


@dataclass(frozen=True, slots=True)
class DeleteCordon:
    node: NodeId


@dataclass(frozen=True, slots=True)
class PutClock:
    """The controller was running at `now_ms` (written at most once per heartbeat interval)."""

    now_ms: int


Write = (
    PutProfile
    | PutDeployment
    | DeleteDeployment
    | PutNode
    | DeleteNode
    | PutReplica
    | DeleteReplica
    | PutSeq
    | PutFailedGpu
    | DeleteFailedGpu
    | PutSilence
    | DeleteSilence
    | PutQuarantine
    | DeleteQuarantine
    | PutCordon
    | DeleteCordon
    | PutClock
)


@dataclass(frozen=True, slots=True)
class DurableState:
    """Everything the store holds, each collection sorted by key."""

    profiles: tuple[Profile, ...] = ()
    deployments: tuple[Deployment, ...] = ()
    nodes: tuple[NodeInfo, ...] = ()
    replicas: tuple[ReplicaRow, ...] = ()
    seqs: tuple[tuple[ModelName, int], ...] = field(default=())
    failed_gpus: tuple[tuple[NodeId, int], ...] = ()
    silent: tuple[tuple[NodeId, int], ...] = ()
    """(node, silent since) for every node not heard since that time."""
    quarantines: tuple[QuarantineRow, ...] = ()
    clock_ms: int = 0
    cordons: tuple[tuple[NodeId, bool], ...] = ()
    """(node, draining) for every node the operator cordoned (kept across its forgetting)."""

    def apply(self, writes: tuple[Write, ...] | list[Write]) -> DurableState:
        profiles = {p.name: p for p in self.profiles}
        deployments = {d.model: d for d in self.deployments}
        nodes = {n.node: n for n in self.nodes}
        replicas = {r.id: r for r in self.replicas}
        seqs = dict(self.seqs)
        failed = set(self.failed_gpus)
        silent = dict(self.silent)
        quarantines = {(q.node, q.profile): q for q in self.quarantines}
        cordons = dict(self.cordons)
        clock = self.clock_ms
        for w in writes:
            match w:
                case PutProfile(profile=p):
                    profiles[p.name] = p
                case PutDeployment(deployment=d):
                    deployments[d.model] = d
                case DeleteDeployment(model=m):
                    deployments.pop(m, None)
                case PutNode(info=n):
                    nodes[n.node] = n
                case DeleteNode(node=gone):
                    nodes.pop(gone, None)
                    failed = {(n, g) for n, g in failed if n != gone}
                    silent.pop(gone, None)
                    quarantines = {k: q for k, q in quarantines.items() if k[0] != gone}
                case PutReplica(row=r):
                    replicas[r.id] = r
                case DeleteReplica(replica=rid):
                    replicas.pop(rid, None)
                case PutSeq(model=m, seq=s):
                    seqs[m] = s
                case PutFailedGpu(node=n, gpu=g):
                    failed.add((n, g))
                case DeleteFailedGpu(node=n, gpu=g):
                    failed.discard((n, g))
                case PutSilence(node=n, since_ms=since):
                    silent[n] = since
                case DeleteSilence(node=n):
                    silent.pop(n, None)
                case PutQuarantine(row=q):
                    quarantines[(q.node, q.profile)] = q
                case DeleteQuarantine(node=n, profile=p):
                    quarantines.pop((n, p), None)
                case PutCordon(node=n, draining=draining):
                    cordons[n] = draining
                case DeleteCordon(node=n):
                    cordons.pop(n, None)
                case PutClock(now_ms=t):
                    clock = t
                case _:
                    assert_never(w)
        return replace(
            self,
            profiles=tuple(profiles[k] for k in sorted(profiles)),
            deployments=tuple(deployments[k] for k in sorted(deployments)),
            nodes=tuple(nodes[k] for k in sorted(nodes)),
            replicas=tuple(replicas[k] for k in sorted(replicas)),
            seqs=tuple(sorted(seqs.items())),
            failed_gpus=tuple(sorted(failed)),
            silent=tuple(sorted(silent.items())),
            quarantines=tuple(quarantines[k] for k in sorted(quarantines)),
            clock_ms=clock,
            cordons=tuple(sorted(cordons.items())),
        )

    def node_ids(self) -> list[NodeId]:
        return [n.node for n in self.nodes]
