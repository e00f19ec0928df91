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
from typing import TypeVar, assert_never

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
    group: str = ""
    """Its role group (`control/groups.py`), with its role in `specs[0].role`; empty: none."""


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
class PutModelFailures:
    """When the model's replicas failed of late (its crash-loop back-off); none: the row goes."""

    model: ModelName
    times_ms: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PutNodeFailures:
    """When the profile's shards failed on the node of late (toward its quarantine); none: the
    row goes."""

    node: NodeId
    profile: ProfileName
    times_ms: tuple[int, ...]


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
    | PutModelFailures
    | PutNodeFailures
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
    model_failures: tuple[tuple[ModelName, tuple[int, ...]], ...] = ()
    node_failures: tuple[tuple[tuple[NodeId, ProfileName], tuple[int, ...]], ...] = ()
    """The failure history a successor's back-off and quarantines count on."""

    def apply(self, writes: tuple[Write, ...] | list[Write]) -> DurableState:
        books = _Books(self)
        for w in writes:
            books.apply(w)
        return books.state(self)

    def node_ids(self) -> list[NodeId]:
        return [n.node for n in self.nodes]


class _Books:
    """A `DurableState` as dicts, while writes are applied to it."""

    def __init__(self, s: DurableState) -> None:
        self.profiles = {p.name: p for p in s.profiles}
        self.deployments = {d.model: d for d in s.deployments}
        self.nodes = {n.node: n for n in s.nodes}
        self.replicas = {r.id: r for r in s.replicas}
        self.seqs = dict(s.seqs)
        self.failed = set(s.failed_gpus)
        self.silent = dict(s.silent)
        self.quarantines = {(q.node, q.profile): q for q in s.quarantines}
        self.cordons = dict(s.cordons)
        self.by_model = dict(s.model_failures)
        self.by_node = dict(s.node_failures)
        self.clock = s.clock_ms

    def apply(self, w: Write) -> None:
        match w:
            case PutProfile(profile=p):
                self.profiles[p.name] = p
            case PutDeployment(deployment=d):
                self.deployments[d.model] = d
            case DeleteDeployment(model=m):
                self.deployments.pop(m, None)
            case PutNode(info=n):
                self.nodes[n.node] = n
            case DeleteNode(node=gone):
                self.nodes.pop(gone, None)
                self.failed = {(n, g) for n, g in self.failed if n != gone}
                self.silent.pop(gone, None)
                self.quarantines = {k: q for k, q in self.quarantines.items() if k[0] != gone}
                self.by_node = {k: t for k, t in self.by_node.items() if k[0] != gone}
            case PutReplica(row=r):
                self.replicas[r.id] = r
            case DeleteReplica(replica=rid):
                self.replicas.pop(rid, None)
            case PutSeq(model=m, seq=s):
                self.seqs[m] = s
            case PutFailedGpu(node=n, gpu=g):
                self.failed.add((n, g))
            case DeleteFailedGpu(node=n, gpu=g):
                self.failed.discard((n, g))
            case PutSilence(node=n, since_ms=since):
                self.silent[n] = since
            case DeleteSilence(node=n):
                self.silent.pop(n, None)
            case PutQuarantine(row=q):
                self.quarantines[(q.node, q.profile)] = q
            case DeleteQuarantine(node=n, profile=p):
                self.quarantines.pop((n, p), None)
            case PutCordon(node=n, draining=draining):
                self.cordons[n] = draining
            case DeleteCordon(node=n):
                self.cordons.pop(n, None)
            case PutClock(now_ms=t):
                self.clock = t
            case PutModelFailures(model=m, times_ms=times):
                _keep(self.by_model, m, times)
            case PutNodeFailures(node=n, profile=p, times_ms=times):
                _keep(self.by_node, (n, p), times)
            case _:
                assert_never(w)

    def state(self, s: DurableState) -> DurableState:
        return replace(
            s,
            profiles=tuple(self.profiles[k] for k in sorted(self.profiles)),
            deployments=tuple(self.deployments[k] for k in sorted(self.deployments)),
            nodes=tuple(self.nodes[k] for k in sorted(self.nodes)),
            replicas=tuple(self.replicas[k] for k in sorted(self.replicas)),
            seqs=tuple(sorted(self.seqs.items())),
            failed_gpus=tuple(sorted(self.failed)),
            silent=tuple(sorted(self.silent.items())),
            quarantines=tuple(self.quarantines[k] for k in sorted(self.quarantines)),
            clock_ms=self.clock,
            cordons=tuple(sorted(self.cordons.items())),
            model_failures=tuple(sorted(self.by_model.items())),
            node_failures=tuple(sorted(self.by_node.items())),
        )


_K = TypeVar("_K")


def _keep(book: dict[_K, tuple[int, ...]], key: _K, times: tuple[int, ...]) -> None:
    """A history row: kept while it has times, gone once it has none."""
    if times:
        book[key] = times
    else:
        book.pop(key, None)
