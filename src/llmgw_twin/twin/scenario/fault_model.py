"""A scenario's faults after loading: each action a fault may take, its YAML key, and `Fault`
(when, which action, its id and line). Part of the scenario model (`model.py`, which names
them too); `loader.py` builds them, the twin's world and real mode carry them out.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmgw_twin.control.model import (
    FabricId,
    ModelName,
    NodeId,
    NodeInfo,
    ProfileName,
)
from llmgw_twin.twin.scenario.topo_actions import (
    TOPOLOGY_FAULT_KEYS,
    LeafDown,
    NvlinkDegraded,
    NvlinkDomainDown,
    SpineDown,
)

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
