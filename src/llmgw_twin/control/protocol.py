"""Messages into and out of the pure cores: what the shells deliver, and what they must carry out.

Controller inputs are `ControllerEvent`s; its outputs are `ControllerCommand`s. Agent inputs are
`AgentEvent`s; its outputs are `AgentCommand`s. A shell (the SimPy twin, or the asyncio service)
moves these between processes; the cores never see a socket, a clock or a process.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmgw_twin.control.autoscale import AutoscalePolicy, LoadSample
from llmgw_twin.control.durable import Write
from llmgw_twin.control.model import (
    Deployment,
    ModelName,
    NodeId,
    NodeInfo,
    Profile,
    ProfileName,
    ShardKey,
    ShardReport,
    ShardSpec,
    TraceEvent,
)

# --- into the controller ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeRegistered:
    """An agent (re)joined, or answered a report request; it reports what it already runs.
    `incarnation` changes each time the agent process starts (a boot counter or start time), so
    the controller can tell a rebooted node from one that merely registered again."""

    info: NodeInfo
    shards: tuple[ShardReport, ...] = ()
    incarnation: int = 0
    failed_gpus: tuple[int, ...] = ()
    fabric_up: bool = True
    heartbeat_interval_ms: int = 0
    """How often the agent heartbeats (0: not said): one not shorter than the controller's
    `node_suspect_after` gets `node.heartbeat_too_slow`, as its node would turn suspect between
    heartbeats."""
    version: int = 0
    """The report's version within its incarnation (as a heartbeat's)."""


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """An agent is alive, runs exactly these shards, and has these GPUs failed (never to be
    placed on again)."""

    node: NodeId
    shards: tuple[ShardReport, ...] = ()
    failed_gpus: tuple[int, ...] = ()
    fabric_up: bool = True
    """The node's fabric links (InfiniBand ports) are up: it can hold a multi-node shard."""
    incarnation: int = 0
    """The agent process's, as in its registration: a heartbeat of an older one (sent before a
    restart, delivered after) is ignored. 0: not said (an agent from before incarnations)."""
    version: int = 0
    """The report's version within the incarnation: the agent bumps it whenever its report
    changes, so a report that arrives after a newer one of the same process (delayed on the
    way) is stale: the controller hears the node alive by it and ignores its contents. 0: not
    said (an agent from before report versions)."""


@dataclass(frozen=True, slots=True)
class ApplyProfile:
    profile: Profile


@dataclass(frozen=True, slots=True)
class ApplyDeployment:
    """Create or change a deployment; `replicas=0` scales it to nothing."""

    deployment: Deployment


@dataclass(frozen=True, slots=True)
class ClearFailedGpu:
    """The operator says a failed GPU was repaired or replaced: it may be placed on again (unless
    the node's inventory still reports it failed)."""

    node: NodeId
    gpu: int


@dataclass(frozen=True, slots=True)
class ClearQuarantine:
    """The operator lifts a node's quarantine, for one profile or (None) for every profile."""

    node: NodeId
    profile: ProfileName | None = None


@dataclass(frozen=True, slots=True)
class DeleteDeployment:
    """The operator deletes a deployment: every replica of it is retired and it is forgotten."""

    model: ModelName


@dataclass(frozen=True, slots=True)
class Cordon:
    """The operator takes a node out of placement (`cordoned=False` puts it back; that also ends
    a drain). What runs there keeps running."""

    node: NodeId
    cordoned: bool = True


@dataclass(frozen=True, slots=True)
class Drain:
    """The operator empties a node: it is cordoned, and each replica with a shard on it gets a
    copy elsewhere; the original is retired once its copy is ready (make-before-break)."""

    node: NodeId


@dataclass(frozen=True, slots=True)
class ControllerLagged:
    """The controller's own shell fell `lag_ms` behind (its event loop ran late: overloaded, or
    paused): heartbeats waited that long to be heard, so that long of every node's silence is
    not the node's. Only the production shell sends it; the twin never falls behind."""

    lag_ms: int


@dataclass(frozen=True, slots=True)
class ApplyAutoscale:
    """Set a model's autoscaling policy (`control/autoscale.py`); the shell says it at every
    controller start, from its configuration, as it does the timings."""

    policy: AutoscalePolicy


@dataclass(frozen=True, slots=True)
class LoadReport:
    """The autoscaled models' load now (the router's and engines' figures), from the shell,
    every policy's `interval`."""

    samples: tuple[LoadSample, ...]


ControllerEvent = (
    NodeRegistered
    | Heartbeat
    | ApplyProfile
    | ApplyDeployment
    | ClearFailedGpu
    | ClearQuarantine
    | DeleteDeployment
    | Cordon
    | Drain
    | ControllerLagged
    | ApplyAutoscale
    | LoadReport
)

# --- out of the controller -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AssignShards:
    """The whole set of shards `node` should run. The agent converges to it: starts what is new,
    stops what is gone. Sending it twice is harmless."""

    node: NodeId
    shards: tuple[ShardSpec, ...]
    epoch: int = 0
    """The sending leader's, stamped by its shell (the core leaves it 0): an agent that has seen
    a higher epoch refuses the command."""


@dataclass(frozen=True, slots=True)
class RequestReport:
    """Ask an agent to (re)register now with everything it runs: a restarted controller does
    this to every node it knows, and to any node whose heartbeat it cannot place."""

    node: NodeId
    epoch: int = 0
    """As `AssignShards.epoch`."""


ControllerCommand = AssignShards | RequestReport


@dataclass(frozen=True, slots=True)
class Step:
    """What one call into the controller decided: commands to carry out, events for the trace,
    when it wants to be called again (`wake_at_ms`, or None for "only on the next event"), and
    the durable writes the shell must commit, in one transaction, before any command goes out."""

    commands: tuple[ControllerCommand, ...] = ()
    events: tuple[TraceEvent, ...] = ()
    wake_at_ms: int | None = None
    writes: tuple[Write, ...] = ()


# --- into the agent --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Assigned:
    """The controller's desired shard set for this node arrived, from the leader of `epoch`."""

    shards: tuple[ShardSpec, ...]
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class SidecarUp:
    key: ShardKey


@dataclass(frozen=True, slots=True)
class EngineStarted:
    """The engine process for `key` is running with this argv."""

    key: ShardKey
    argv: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class EngineJoined:
    """A worker joined its leader's rendezvous."""

    key: ShardKey


@dataclass(frozen=True, slots=True)
class EngineServing:
    """The leader answers on `endpoint`."""

    key: ShardKey
    endpoint: str


@dataclass(frozen=True, slots=True)
class EngineUnresponsive:
    """A ready rank's probe got no answer in time (its process is still alive): a leader's
    health endpoint, a worker's process (stopped); a later `EngineServing` (a leader) or
    `EngineJoined` (a worker) says it answers again."""

    key: ShardKey


@dataclass(frozen=True, slots=True)
class FabricLink:
    """The node's fabric links (InfiniBand port state) went down or came back up."""

    up: bool


@dataclass(frozen=True, slots=True)
class EngineExited:
    key: ShardKey
    exit_code: int
    reason: str | None = None
    """Why, when the agent itself ended the shard or refused to start it (its exit codes above
    255); None for a process's own exit."""


@dataclass(frozen=True, slots=True)
class ShardStopped:
    """Every process of a stopped shard has ended: its GPUs are free. `token`: the `StopShard`'s
    (0 for a stop the agent core did not ask for, which frees nothing)."""

    key: ShardKey
    token: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class GpuFailed:
    """The node's inventory found a GPU failed (an Xid error, fallen off the bus)."""

    gpu: int


@dataclass(frozen=True, slots=True)
class HeartbeatDue:
    """The agent's heartbeat timer fired."""


@dataclass(frozen=True, slots=True)
class ReportRequested:
    """The controller (the leader of `epoch`) asked for a full registration now."""

    epoch: int = 0


AgentEvent = (
    Assigned
    | SidecarUp
    | EngineStarted
    | EngineJoined
    | EngineServing
    | EngineUnresponsive
    | EngineExited
    | ShardStopped
    | GpuFailed
    | FabricLink
    | HeartbeatDue
    | ReportRequested
)

# --- out of the agent ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StartSidecar:
    spec: ShardSpec


@dataclass(frozen=True, slots=True)
class StartEngine:
    spec: ShardSpec


@dataclass(frozen=True, slots=True)
class StopShard:
    """Stop the shard's engine and sidecar (both, whatever stage it reached); the shell answers
    `ShardStopped` with the same `token` once every process of it has ended. The token tells
    one stop of a key from another (a key can be stopped, started and stopped again while the
    first stop is still under way); it takes no part in equality."""

    key: ShardKey
    token: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class SendReport:
    """Send this heartbeat or registration, with the node's whole shard set, to the controller."""

    report: Heartbeat | NodeRegistered


AgentCommand = StartSidecar | StartEngine | StopShard | SendReport


@dataclass(frozen=True, slots=True)
class AgentStep:
    commands: tuple[AgentCommand, ...] = field(default=())
    refused: int | None = None
    """The epoch of a controller command refused (older than one the agent has seen): nothing
    else was done."""
