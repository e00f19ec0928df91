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
from llmgw_twin.twin.scenario.fault_model import (
    FAULT_KEYS,
    AddNode,
    ClockSkew,
    Cordon,
    CrashNode,
    CutFabricLink,
    DelayHeartbeats,
    DeleteDeployment,
    FabricDown,
    FailGpu,
    Fault,
    FaultAction,
    HangEngine,
    KillController,
    KillEngine,
    KillNode,
    Partition,
    PartitionController,
    RestartAgent,
    RestartController,
    RestartNode,
    SetProfile,
    SetReplicas,
    SlowNode,
    StallController,
    StoreDown,
)
from llmgw_twin.twin.scenario.initial_model import Initial
from llmgw_twin.twin.scenario.workload_model import EngineModel, SloExpectation, Workload

__all__ = [
    "EVENT_KINDS",
    "EVENT_SUBJECTS",
    "FAULT_KEYS",
    "AddNode",
    "ClockSkew",
    "Cordon",
    "CrashNode",
    "CutFabricLink",
    "DelayHeartbeats",
    "DeleteDeployment",
    "EventExpectation",
    "FabricDown",
    "FailGpu",
    "Fault",
    "FaultAction",
    "HangEngine",
    "KillController",
    "KillEngine",
    "KillNode",
    "Partition",
    "PartitionController",
    "RequestsExpectation",
    "RestartAgent",
    "RestartController",
    "RestartNode",
    "Scenario",
    "SetProfile",
    "SetReplicas",
    "SlowNode",
    "StallController",
    "StateExpectation",
    "StoreDown",
    "Traffic",
]

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
