"""A scenario after loading: every name checked, every time resolved to integer milliseconds.

`loader.py` builds these from a YAML file (the format in docs/scenarios.md); the twin runs them.
Nothing here refers back to YAML except the `line` kept on faults and expectations, so that a
failing expectation can point at the line it came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmgw_twin.control.autoscale import AutoscalePolicy
from llmgw_twin.control.model import (
    CONTROL_EVENT_KINDS,
    Deployment,
    FabricId,
    ModelName,
    NodeId,
    NodeInfo,
    Profile,
    ProfileName,
    Timings,
)
from llmgw_twin.twin.scenario.initial_model import Initial
from llmgw_twin.twin.scenario.topo_actions import (
    TOPOLOGY_FAULT_KEYS,
    LeafDown,
    NvlinkDegraded,
    NvlinkDomainDown,
    SpineDown,
)
from llmgw_twin.twin.scenario.workload_model import EngineModel, SloExpectation, Workload

# --- faults ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KillNode:
    node: NodeId


@dataclass(frozen=True, slots=True)
class CrashNode:
    """The node's processes die at once and their sockets close (unlike `KillNode`'s power-off:
    peers on other nodes see their connections drop)."""

    node: NodeId


@dataclass(frozen=True, slots=True)
class RestartNode:
    node: NodeId


@dataclass(frozen=True, slots=True)
class Partition:
    nodes: tuple[NodeId, ...]
    for_ms: int


@dataclass(frozen=True, slots=True)
class KillEngine:
    node: NodeId
    replica_of: ModelName


@dataclass(frozen=True, slots=True)
class HangEngine:
    """One engine of `replica_of` on `node` stays alive, its port open, and answers nothing."""

    node: NodeId
    replica_of: ModelName


@dataclass(frozen=True, slots=True)
class RestartController:
    down_for_ms: int
    controller: str | None = None
    """`cN`, or None / `leader`: whichever leads at that instant."""


# --- the controllers' own faults (version 1.2) -----------------------------------------------


@dataclass(frozen=True, slots=True)
class KillController:
    """The controller's process dies and stays down (`leader`: whichever leads)."""

    controller: str


@dataclass(frozen=True, slots=True)
class StallController:
    """The controller freezes for `for_ms` (a VM pause, SIGSTOP) and resumes with its memory."""

    controller: str
    for_ms: int


@dataclass(frozen=True, slots=True)
class PartitionController:
    """The controller and `side` (`store`, `agents`, `peers` or `all`) cannot reach each other
    for `for_ms`."""

    controller: str
    side: str
    for_ms: int


@dataclass(frozen=True, slots=True)
class StoreDown:
    """The store refuses every read and write for `for_ms`."""

    for_ms: int


@dataclass(frozen=True, slots=True)
class ClockSkew:
    """The controller's clock runs at `rate` times real time from then on (exact: a fraction
    of integers, as written)."""

    controller: str
    rate_num: int
    rate_den: int


@dataclass(frozen=True, slots=True)
class RestartAgent:
    """The project's extension: the node's agent process dies (its shards keep running) and a
    new one starts `down_for_ms` later, finding and adopting them."""

    node: NodeId
    down_for_ms: int


@dataclass(frozen=True, slots=True)
class FailGpu:
    node: NodeId
    gpu: int


@dataclass(frozen=True, slots=True)
class FabricDown:
    fabric: FabricId
    for_ms: int


@dataclass(frozen=True, slots=True)
class SetReplicas:
    model: ModelName
    replicas: int


@dataclass(frozen=True, slots=True)
class SetProfile:
    """The operator changes the deployment of `model` to `profile` (version 1.2): its replicas
    are rolled over to the new profile (`control/rollout.py`)."""

    model: ModelName
    profile: ProfileName


# --- fault shapes real fleets show (version 1.2) ---------------------------------------------


@dataclass(frozen=True, slots=True)
class CutFabricLink:
    """`node` loses its fabric link for `for_ms`: its fabric peers cannot reach it (nor it them),
    the controller still hears it."""

    node: NodeId
    for_ms: int


@dataclass(frozen=True, slots=True)
class SlowNode:
    """`node`'s engines run `factor` times slower for `for_ms` (a straggler): exact, a fraction of
    integers as written."""

    node: NodeId
    factor_num: int
    factor_den: int
    for_ms: int


@dataclass(frozen=True, slots=True)
class DelayHeartbeats:
    """Heartbeats `nodes` send during `for_ms` arrive `by_ms` late instead of on time."""

    nodes: tuple[NodeId, ...]
    by_ms: int
    for_ms: int


@dataclass(frozen=True, slots=True)
class AddNode:
    """A new node (its facts in `info`) is onboarded and boots at the fault's time."""

    info: NodeInfo


@dataclass(frozen=True, slots=True)
class Cordon:
    """An operator action beyond the contract's faults: `cordon: N`, `uncordon: N`, `drain: N`
    (`op` is the key)."""

    node: NodeId
    op: str


@dataclass(frozen=True, slots=True)
class DeleteDeployment:
    """The operator deletes a deployment: `delete_deployment: MODEL`."""

    model: ModelName


FaultAction = (
    KillNode
    | CrashNode
    | RestartNode
    | Partition
    | KillEngine
    | HangEngine
    | RestartController
    | RestartAgent
    | FailGpu
    | FabricDown
    | SetReplicas
    | Cordon
    | DeleteDeployment
    | KillController
    | StallController
    | PartitionController
    | StoreDown
    | ClockSkew
    | CutFabricLink
    | SlowNode
    | DelayHeartbeats
    | AddNode
    | SetProfile
    | LeafDown
    | SpineDown
    | NvlinkDomainDown
    | NvlinkDegraded
)

FAULT_KEYS: dict[str, type] = {
    "kill_node": KillNode,
    "crash_node": CrashNode,
    "restart_node": RestartNode,
    "partition": Partition,
    "kill_engine": KillEngine,
    "hang_engine": HangEngine,
    "restart_controller": RestartController,
    "restart_agent": RestartAgent,
    "fail_gpu": FailGpu,
    "fabric_down": FabricDown,
    "set_replicas": SetReplicas,
    "cordon": Cordon,
    "uncordon": Cordon,
    "drain": Cordon,
    "delete_deployment": DeleteDeployment,
    "kill_controller": KillController,
    "stall_controller": StallController,
    "partition_controller": PartitionController,
    "store_down": StoreDown,
    "clock_skew": ClockSkew,
    "cut_fabric_link": CutFabricLink,
    "slow_node": SlowNode,
    "delay_heartbeats": DelayHeartbeats,
    "add_node": AddNode,
    "set_profile": SetProfile,
    **TOPOLOGY_FAULT_KEYS,
}
"""The YAML key of each fault action."""


@dataclass(frozen=True, slots=True)
class Fault:
    at_ms: int
    action: FaultAction
    id: str | None = None
    line: int = 0


# --- expectations ----------------------------------------------------------------------------

EVENT_KINDS: tuple[str, ...] = ("fault.injected", *CONTROL_EVENT_KINDS)
"""Every kind a trace may hold: the world's faults and the control plane's events."""

EVENT_SUBJECTS: tuple[str, ...] = (
    "node",
    "fabric",
    "model",
    "replica",
    "rank",
    "nodes",
    "reason",
    "argv",
    "fault",
    "action",
    "replicas",
    "adopted",
    "restored",
    "ready",
    "down_for_ms",
    "gpu",
    "endpoint",
    "profile",
    "until_ms",
    "delay_ms",
    "silent",
    "fleet",
    "heard",
    "controller",
    "epoch",
    "side",
    "leaf",
    "spine",
    "domain",
    "group",
    "role",
)
"""Subject fields an event may carry, and so the filters an event expectation may use."""


@dataclass(frozen=True, slots=True)
class EventExpectation:
    """`kind` events matching every filter, inside [start_ms, end_ms] (both inclusive).

    Plain: at least one. `never`: none. `count`: exactly that many.
    """

    kind: str
    filters: tuple[tuple[str, str | int], ...]
    start_ms: int
    end_ms: int
    never: bool = False
    count: int | None = None
    at_most: int | None = None
    line: int = 0
    text: str = ""


@dataclass(frozen=True, slots=True)
class StateExpectation:
    """State assertions judged on the controller's view at `at_ms` (after every event at that
    instant). An absent assertion is None."""

    at_ms: int
    ready_replicas: tuple[tuple[ModelName, int], ...] | None = None
    idle_nodes: tuple[NodeId, ...] | None = None
    node_state: tuple[tuple[NodeId, str], ...] | None = None
    replicas_in: tuple[tuple[FabricId, int], ...] | None = None
    leader: str | None = None
    """That controller leads at `at_ms`."""
    leaders: int | None = None
    """Exactly this many controllers lead at `at_ms`."""
    line: int = 0
    text: str = ""


@dataclass(frozen=True, slots=True)
class RequestsExpectation:
    """Of the requests to `model` that arrive inside [start_ms, end_ms], at most `failed_max`
    failed."""

    model: ModelName
    failed_max: int
    start_ms: int
    end_ms: int
    line: int = 0
    text: str = ""


Expectation = EventExpectation | StateExpectation | RequestsExpectation | SloExpectation


# --- traffic ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Traffic:
    """Clients send `model` requests of `tokens` tokens through the router for the whole run,
    evenly spaced: `count` requests every `every_ms` (the rate, as an exact fraction)."""

    model: ModelName
    count: int
    every_ms: int
    tokens: int
    line: int = 0
    workload: Workload | None = None
    """Rate shapes, token lengths or a trace (`workload_model.py`); None: the contract's item."""

    def arrival_ms(self, i: int) -> int:
        """When request `i` (from 0) arrives."""
        return i * self.every_ms // self.count

    def requests_until(self, end_ms: int) -> int:
        """How many requests arrive in [0, end_ms]."""
        return ((end_ms + 1) * self.count + self.every_ms - 1) // self.every_ms


INVARIANTS: tuple[str, ...] = (
    "single_fabric",
    "gpu_exclusive",
    "ready_is_whole",
    "routes_to_ready",
    "no_orphans",
    "one_epoch_acts",
)


# --- the scenario ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Scenario:
    path: str
    name: str
    duration_ms: int
    nodes: tuple[NodeInfo, ...]
    """Every node booted at the start, in the order the file lists them under `cluster.fabrics`
    (`all_nodes` adds those an `add_node` fault brings later)."""
    fabrics: tuple[tuple[FabricId, tuple[NodeId, ...]], ...]
    description: str = ""
    seed: int = 0
    timings: Timings = field(default_factory=Timings)
    profiles: tuple[Profile, ...] = ()
    deployments: tuple[Deployment, ...] = ()
    faults: tuple[Fault, ...] = ()
    """Sorted by `at_ms`, ties in file order."""
    expectations: tuple[Expectation, ...] = ()
    traffic: tuple[Traffic, ...] = ()
    invariants_off: tuple[tuple[str, str], ...] = ()
    """Invariant name -> the reason it is off."""
    controllers: int = 1
    """Controller processes on the one store (`c1`..`cK`); c1 starts first and leads first."""
    engine_model: tuple[EngineModel, ...] = ()
    """Profiles whose replicas serve with the engine performance model (`engine_model:`)."""
    autoscale: tuple[AutoscalePolicy, ...] = ()
    """Deployments whose replica count follows their load (`deployments[].autoscale`)."""
    initial: Initial | None = None
    """The state the fleet starts in (`initial`, `twin/scenario/initial.py`); None: empty nodes
    and a controller that places every deployment from scratch."""

    @property
    def added_nodes(self) -> tuple[NodeInfo, ...]:
        """The nodes `add_node` faults bring, in time order."""
        return tuple(f.action.info for f in self.faults if isinstance(f.action, AddNode))

    @property
    def all_nodes(self) -> tuple[NodeInfo, ...]:
        """Every node the run ever has: the boot-time fleet, then the added ones."""
        return self.nodes + self.added_nodes

    @property
    def all_fabrics(self) -> tuple[tuple[FabricId, tuple[NodeId, ...]], ...]:
        """`fabrics` with each added node under its fabric (after the boot-time members)."""
        added = self.added_nodes
        if not added:
            return self.fabrics
        return tuple(
            (fabric, members + tuple(n.node for n in added if n.fabric == fabric))
            for fabric, members in self.fabrics
        )

    def profile(self, name: ProfileName) -> Profile:
        for p in self.profiles:
            if p.name == name:
                return p
        raise KeyError(name)
