"""The control plane's vocabulary: ids, static facts, desired state and lifecycle states.

Everything here is a frozen value. Ids are `NewType`s over `str`; times are integer
milliseconds (`*_ms`), so virtual time never drifts. Nothing in this module does I/O.
The settings (`Timings`) live in `control/timings.py` and are imported from here, as every
name of the vocabulary is (`__all__`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple, NewType

from llmgw_twin.control.timings import Timings
from llmgw_twin.control.topology import ANY, NodeTopology, TopologyRules

__all__ = [
    "CONTROL_EVENT_KINDS",
    "ENGINES",
    "MAX_ROLE_COUNT",
    "RENDEZVOUS_PORT_BASE",
    "ROLE_NAMES",
    "Deployment",
    "EngineName",
    "FabricId",
    "ModelName",
    "NodeId",
    "NodeInfo",
    "NodeState",
    "Profile",
    "ProfileName",
    "ReplicaId",
    "ReplicaState",
    "Role",
    "ShardKey",
    "ShardReport",
    "ShardSpec",
    "ShardState",
    "Timings",
    "TraceEvent",
]

NodeId = NewType("NodeId", str)
FabricId = NewType("FabricId", str)
ProfileName = NewType("ProfileName", str)
ModelName = NewType("ModelName", str)
ReplicaId = NewType("ReplicaId", str)
EngineName = NewType("EngineName", str)

ENGINES: tuple[str, ...] = ("sim", "llamacpp", "vllm", "sglang")
"""The engines the control plane knows how to launch."""

CONTROL_EVENT_KINDS: tuple[str, ...] = (
    "node.joined",
    "node.suspect",
    "node.lost",
    "node.recovered",
    "node.link_down",
    "node.link_up",
    "node.quarantined",
    "node.unquarantined",
    "node.forgotten",
    "node.heartbeat_too_slow",
    "node.cordoned",
    "node.uncordoned",
    "node.draining",
    "node.drained",
    "gpu.failed",
    "gpu.cleared",
    "fleet.hold",
    "fleet.resumed",
    "fleet.loss_accepted",
    "node.loss_paced",
    "replica.placed",
    "shard.started",
    "shard.serving",
    "replica.ready",
    "replica.degraded",
    "replica.recovered",
    "replica.unroutable",
    "replica.routable",
    "replica.failed",
    "replica.reaped",
    "replica.unplaceable",
    "replica.backoff",
    "replica.adopted",
    "replica.forgiven",
    "replica.moving",
    "replica.moved",
    "replica.move_aborted",
    "group.dissolved",
    "deployment.deleted",
    "deployment.scaled",
    "deployment.profile_changed",
    "deployment.rolled_out",
    "controller.started",
    "controller.leader",
    "controller.deposed",
    "command.refused",
)
"""Every kind of event the control plane emits (docs/scenarios.md says what each means)."""

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
    DEGRADED = "degraded"  # was ready; its leader stopped answering: out of routing, on a grace
    FAILED = "failed"  # a shard was lost or exited: the replica is whole no more
    REAPED = "reaped"  # its shards were told to stop and its GPUs freed

    @property
    def live(self) -> bool:
        """Counts toward the deployment's desired replicas."""
        return self is not ReplicaState.FAILED and self is not ReplicaState.REAPED


class ShardState(enum.StrEnum):
    """A shard as its node agent reports it."""

    PREPARING = "preparing"  # accepted: waiting for its GPUs, or its sidecar starting
    STARTING = "starting"  # sidecar up, engine process started, model loading / joining
    RUNNING = "running"  # a worker that joined its leader; it serves nothing itself
    SERVING = "serving"  # the leader, every worker joined, answering on its endpoint
    UNRESPONSIVE = "unresponsive"  # the engine's process is alive but its probe fails
    EXITED = "exited"  # the engine process ended


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What a node agent tells the controller when it registers."""

    node: NodeId
    fabric: FabricId
    gpus: int
    gpu_memory_mib: int
    engines: tuple[EngineName, ...]
    topology: NodeTopology | None = None
    """Its leaf, spine and NVLink domain (`control/topology.py`); None: not known."""


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
    start_timeout_ms: int = 0
    """Placement to ready at most this long; 0: twice the load time plus the start grace."""
    topology: TopologyRules = ANY
    """Placement rules per topology level (`control/topology.py`); `ANY`: none."""

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise ValueError("a profile needs at least one node and one GPU per node")


ROLE_NAMES: tuple[str, ...] = ("prefill", "decode")
"""The roles a role group knows: prefill answers a request's prompt, decode its tokens."""
MAX_ROLE_COUNT = 64
"""The most replicas of one role in one group."""


@dataclass(frozen=True, slots=True)
class Role:
    """One role of a role group: `count` replicas of `profile` in each group."""

    name: str
    profile: ProfileName
    count: int = 1

    def __post_init__(self) -> None:
        if self.name not in ROLE_NAMES:
            raise ValueError(f"role {self.name!r}: expected one of {', '.join(ROLE_NAMES)}")
        if not 1 <= self.count <= MAX_ROLE_COUNT:
            raise ValueError(f"role {self.name}: count must be from 1 to {MAX_ROLE_COUNT}")


@dataclass(frozen=True, slots=True)
class Deployment:
    """Desired state: `replicas` whole replicas of `model`, each laid out by `profile`.

    With `roles` (`control/groups.py`), each of the `replicas` is a role group: every role's
    `count` replicas of its own profile, all in one fabric; `profile` is then the prefill role's.
    Roles are kept in `ROLE_NAMES` order, however they were given."""

    model: ModelName
    profile: ProfileName
    replicas: int
    roles: tuple[Role, ...] = ()

    def __post_init__(self) -> None:
        if self.roles:  # one order, so two deployments of the same roles compare equal
            ordered = tuple(sorted(self.roles, key=lambda r: ROLE_NAMES.index(r.name)))
            object.__setattr__(self, "roles", ordered)
        names = [r.name for r in self.roles]
        if len(set(names)) != len(names):
            raise ValueError(f"deployment {self.model}: a role is named twice")
        if self.roles and set(names) != set(ROLE_NAMES):
            raise ValueError(
                f"deployment {self.model}: a role group needs the roles {', '.join(ROLE_NAMES)}"
            )
        if self.roles and self.profile != self.roles[0].profile:
            raise ValueError(f"deployment {self.model}: profile must be the prefill role's")

    def role(self, name: str) -> Role | None:
        return next((r for r in self.roles if r.name == name), None)


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
    role: str = ""
    """The replica's role in a role group (`prefill`, `decode`); empty: not in a group. The
    engine adapter adds the engine's own disaggregation flags for it."""

    @property
    def key(self) -> ShardKey:
        return ShardKey(self.replica, self.rank)

    def same_shard(self, other: ShardSpec) -> bool:
        """The same shard: replica, rank and layout (nodes and GPUs) agree. Launch details
        (ports, args, load time, fields added later) may differ: an agent that runs a shard
        written by an older controller still runs this shard, and is not restarted for it."""
        return (
            self.replica == other.replica
            and self.rank == other.rank
            and self.shard_count == other.shard_count
            and self.node == other.node
            and self.gpus == other.gpus
            and self.leader == other.leader
        )


class ShardKey(NamedTuple):
    """A shard's name: its replica and rank. A named tuple rather than a record: made for every
    look-up of a shard (`ShardSpec.key`), compared and hashed as a tuple, at C speed."""

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
    reason: str | None = None
    """Why the shard exited, when the agent says (it refused the launch, or stopped it)."""


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
