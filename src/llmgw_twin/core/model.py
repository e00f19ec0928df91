"""The control plane's vocabulary: ids, static facts, desired state and lifecycle states.

Everything here is a frozen value. Ids are `NewType`s over `str`; times are integer
milliseconds (`*_ms`), so virtual time never drifts. Nothing in this module does I/O.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NewType

NodeId = NewType("NodeId", str)
FabricId = NewType("FabricId", str)
ProfileName = NewType("ProfileName", str)
ModelName = NewType("ModelName", str)
ReplicaId = NewType("ReplicaId", str)
EngineName = NewType("EngineName", str)

ENGINES: tuple[str, ...] = ("sim", "llamacpp", "vllm", "sglang")
"""The engines the control plane knows how to launch."""

RENDEZVOUS_PORT_BASE = 29500
"""Each rank of a replica gets a port of its own: this plus the rank's first GPU index, unique on
that rank's node because no GPU is held by two shards. Rank 0's is the replica's rendezvous
point; a worker that listens (llama.cpp's RPC server) derives its port from its own."""


class NodeState(enum.StrEnum):
    """Node health as the controller sees it: alive -> suspect -> lost, and back on a heartbeat."""

    ALIVE = "alive"
    SUSPECT = "suspect"
    LOST = "lost"


class ReplicaState(enum.StrEnum):
    """A replica's lifecycle. `failed` and `reaped` are terminal; a replacement is a new replica."""

    PENDING = "pending"  # wanted, not placed (nothing fits yet)
    ADOPTING = "adopting"  # restored after a restart, waiting for its agents' reports
    PLACED = "placed"  # nodes and GPUs booked, shards assigned to agents
    STARTING = "starting"  # at least one shard reported by its agent
    READY = "ready"  # every shard running, the leader serving with an endpoint
    FAILED = "failed"  # a shard was lost or exited: the replica is whole no more
    REAPED = "reaped"  # its shards were told to stop and its GPUs freed

    @property
    def live(self) -> bool:
        """Counts toward the deployment's desired replicas."""
        return self not in (ReplicaState.FAILED, ReplicaState.REAPED)


class ShardState(enum.StrEnum):
    """A shard as its node agent reports it."""

    PREPARING = "preparing"  # accepted: waiting for its GPUs, or its sidecar starting
    STARTING = "starting"  # sidecar up, engine process started, model loading / joining
    RUNNING = "running"  # a worker that joined its leader; it serves nothing itself
    SERVING = "serving"  # the leader, every worker joined, answering on its endpoint
    EXITED = "exited"  # the engine process ended


@dataclass(frozen=True, slots=True)
class Timings:
    """Control-plane settings. Defaults are the production defaults."""

    heartbeat_interval_ms: int = 10_000
    node_suspect_after_ms: int = 30_000
    node_lost_after_ms: int = 60_000
    reconcile_interval_ms: int = 1_000

    def __post_init__(self) -> None:
        for name in (
            "heartbeat_interval_ms",
            "node_suspect_after_ms",
            "node_lost_after_ms",
            "reconcile_interval_ms",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.node_suspect_after_ms > self.node_lost_after_ms:
            raise ValueError("node_suspect_after must not exceed node_lost_after")


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What a node agent tells the controller when it registers."""

    node: NodeId
    fabric: FabricId
    gpus: int
    gpu_memory_mib: int
    engines: tuple[EngineName, ...]


@dataclass(frozen=True, slots=True)
class Profile:
    """How one replica of a model is laid out and launched."""

    name: ProfileName
    engine: EngineName
    nodes: int
    gpus_per_node: int
    model: str
    load_time_ms: int = 0
    args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise ValueError("a profile needs at least one node and one GPU per node")


@dataclass(frozen=True, slots=True)
class Deployment:
    """Desired state: `replicas` whole replicas of `model`, each laid out by `profile`."""

    model: ModelName
    profile: ProfileName
    replicas: int


@dataclass(frozen=True, slots=True)
class ShardSpec:
    """What the controller hands an agent: one shard of one replica.

    The shard carries its own identity (replica, rank, shard count, profile) so that an agent can
    report it and a restarted controller can recognise it. The controller knows nothing of engine
    flags; the agent's shell turns this spec into an argv with the engine adapter.
    """

    replica: ReplicaId
    model: ModelName
    profile: ProfileName
    engine: EngineName
    model_path: str
    rank: int
    shard_count: int
    node: NodeId
    gpus: tuple[int, ...]
    leader: NodeId
    nodes: tuple[NodeId, ...] = ()
    """Every shard's node, by rank (`nodes[0] == leader`): a leader that dials its workers (as
    llama.cpp's does) needs them all."""
    rendezvous_port: int = RENDEZVOUS_PORT_BASE
    rank_ports: tuple[int, ...] = ()
    """Every rank's own port, by rank (`rank_ports[0] == rendezvous_port`); empty in specs
    written before ranks had ports, where adapters fall back to the rendezvous port."""
    load_time_ms: int = 0
    args: tuple[str, ...] = ()

    @property
    def key(self) -> ShardKey:
        return ShardKey(self.replica, self.rank)


@dataclass(frozen=True, slots=True, order=True)
class ShardKey:
    replica: ReplicaId
    rank: int


@dataclass(frozen=True, slots=True)
class ShardReport:
    """One shard as an agent reports it with every heartbeat."""

    spec: ShardSpec
    state: ShardState
    endpoint: str | None = None
    exit_code: int | None = None
    argv: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One state change the control plane made, or a fault the world injected.

    `subjects` holds the event's subjects (node, fabric, model, replica, rank, nodes, reason, argv)
    as sorted key/value pairs so that the event is hashable and its canonical form is stable.
    """

    t_ms: int
    kind: str
    subjects: tuple[tuple[str, object], ...] = field(default=())

    @staticmethod
    def of(t_ms: int, kind: str, **subjects: object) -> TraceEvent:
        pairs = tuple(sorted((k, v) for k, v in subjects.items() if v is not None))
        return TraceEvent(t_ms, kind, pairs)

    def get(self, name: str) -> object:
        for k, v in self.subjects:
            if k == name:
                return v
        return None

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"t_ms": self.t_ms, "kind": self.kind}
        for k, v in self.subjects:
            out[k] = list(v) if isinstance(v, tuple) else v
        return out
