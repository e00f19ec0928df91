"""What real mode refuses up front, and why (`check_real_supported`): a fault the twin models
that these processes on one machine have no means for, a cluster too large for one machine.
Checked before anything starts (`llmgw-twin run --real` exits 2 with the file, the line and
the reason); docs/real-mode.md lists each."""

from __future__ import annotations

from llmgw_twin.realmode import ports
from llmgw_twin.realmode.pgstore import have_postgres
from llmgw_twin.twin.scenario.model import (
    AddNode,
    ClockSkew,
    Cordon,
    CrashNode,
    CutFabricLink,
    DelayHeartbeats,
    DeleteDeployment,
    FabricDown,
    FailGpu,
    HangEngine,
    KillController,
    KillEngine,
    KillNode,
    Partition,
    PartitionController,
    RestartAgent,
    RestartController,
    RestartNode,
    Scenario,
    SetProfile,
    SetReplicas,
    SlowNode,
    StallController,
    StoreDown,
)
from llmgw_twin.twin.scenario.topo_actions import (
    LeafDown,
    NvlinkDegraded,
    NvlinkDomainDown,
    SpineDown,
)
from llmgw_twin.twin.world.faults import fault_subjects

SUPPORTED = (
    KillNode,
    CrashNode,
    RestartNode,
    Partition,
    KillEngine,
    HangEngine,
    RestartController,
    FailGpu,
    FabricDown,
    SetReplicas,
    SetProfile,
    Cordon,
    DeleteDeployment,
    RestartAgent,
    AddNode,
    KillController,
    StallController,
    NvlinkDomainDown,
    CutFabricLink,
    LeafDown,
    SpineDown,
    SlowNode,
    NvlinkDegraded,
    DelayHeartbeats,
)


_NO_SERVER = (
    "the store is taken away on a PostgreSQL server of the run's own behind a proxy per "
    "controller, and Debian's PostgreSQL binaries are not installed (make postgresql)"
)
_ONE_FILE = (
    "real mode's controllers share one SQLite file on this machine, which no proxy stands in "
    "front of, so the store cannot be taken away from one controller or from all (the twin "
    "models it; a PostgreSQL server behind a proxy would make it real)"
)
REFUSED: dict[type, str] = {
    PartitionController: _ONE_FILE,
    StoreDown: _NO_SERVER,
    ClockSkew: (
        "every process on one machine reads the same monotonic and wall clock, and the store's "
        "time is that machine's, so one controller's clock cannot run fast or slow without a "
        "per-process clock (faketime), which real mode does not use (the twin models it)"
    ),
}
"""Why a fault the twin models is refused up front here."""
BY_DIALLER_REFUSED = (
    "one node's link and a spine's split are cut at the fabric proxies by who dials, known by "
    "the address a connection leaves from, and only the sim engine's workers dial from their "
    "node's own address (`--source-host`); llama.cpp's and vLLM's leave from 127.0.0.1 on one "
    "machine, so a fault that parts some nodes of a fabric and not others needs every "
    "multi-node profile on the sim engine"
)

SLOW_REFUSED = (
    "a slowdown makes a node's engines run slower, and only the sim engine reads a pace (its "
    "node's pace file, `--pace-file`); llama.cpp, vLLM and SGLang run at their own speed, so a "
    "slowdown needs every profile on the sim engine"
)

DOMAIN_BACK_REFUSED = (
    "nvlink_domain_down with `for` boots the nodes again, which real mode does only with a "
    "restart_node fault per node: write those instead"
)

AUTOSCALE_REFUSED = (
    "real mode runs a file at a tenth of its time, its requests ten times as often, while the "
    "engines answer at their own pace, so the load the routers report is not the twin's and "
    "the autoscaler's counts would not compare: the autoscaler runs in the twin only"
)
PARTITION_REFUSED = {
    "agents": (
        "a node's address is one per node in the store, shared by every controller, so the "
        "commands of one controller to the agents pass the same proxy as the others' and cannot "
        "be cut for it alone (the twin models it)"
    ),
    "peers": (
        "the controllers reach each other only through the store, so a controller cut from its "
        "peers and not from the store has no link of its own to cut here (the twin models it)"
    ),
    "store": _NO_SERVER,
    "all": (
        "the agents' side of it cannot be cut for one controller alone: a node's address is one "
        "per node in the store, shared by every controller (the twin models it)"
    ),
}
"""Why each side of a `partition_controller` is refused."""


def check_real_supported(scenario: Scenario) -> None:
    if len(scenario.all_nodes) > ports.UNITS:
        raise ValueError(
            f"{scenario.path}: real mode runs at most {ports.UNITS} nodes on one machine "
            f"({ports.PORTS_PER_NODE} ports each), this file has {len(scenario.all_nodes)}"
        )
    if scenario.autoscale:
        raise ValueError(
            f"{scenario.path}: deployments with autoscale are not supported in real mode yet: "
            f"{AUTOSCALE_REFUSED}"
        )
    names = {None, "leader", *(f"c{i + 1}" for i in range(scenario.controllers))}
    for fault in scenario.faults:
        if (
            isinstance(fault.action, (RestartController, KillController, StallController))
            and fault.action.controller not in names
        ):
            raise ValueError(
                f"{scenario.path}:{fault.line}: no controller {fault.action.controller} "
                f"(cluster.controllers: {scenario.controllers})"
            )
        if isinstance(fault.action, (KillController, StallController, StoreDown)) and (
            scenario.controllers < 2
        ):
            raise ValueError(
                f"{scenario.path}:{fault.line}: a controller's own fault needs "
                "cluster.controllers of 2 or more in real mode (one controller: "
                "restart_controller)"
            )
        takes_store = isinstance(fault.action, StoreDown) or (
            isinstance(fault.action, PartitionController) and fault.action.side == "store"
        )
        if takes_store and have_postgres() and scenario.controllers >= 2:
            continue  # on a PostgreSQL server of the run's own (`pgstore.py`)
        if isinstance(fault.action, NvlinkDomainDown) and fault.action.for_ms is not None:
            raise ValueError(
                f"{scenario.path}:{fault.line}: this fault (nvlink_domain_down) is not supported "
                f"in real mode yet: {DOMAIN_BACK_REFUSED}"
            )
        slow = isinstance(fault.action, (SlowNode, NvlinkDegraded))
        if slow and any(p.engine != "sim" for p in scenario.profiles):
            action = fault_subjects(fault)["action"]
            raise ValueError(
                f"{scenario.path}:{fault.line}: this fault ({action}) is not supported in real "
                f"mode with these profiles: {SLOW_REFUSED}"
            )
        by_dialler = isinstance(fault.action, (CutFabricLink, LeafDown, SpineDown))
        if by_dialler and any(p.nodes > 1 and p.engine != "sim" for p in scenario.profiles):
            action = fault_subjects(fault)["action"]
            raise ValueError(
                f"{scenario.path}:{fault.line}: this fault ({action}) is not supported in real "
                f"mode with these profiles: {BY_DIALLER_REFUSED}"
            )
        if not isinstance(fault.action, SUPPORTED):
            action = fault_subjects(fault)["action"]
            why = REFUSED.get(type(fault.action))
            if isinstance(fault.action, PartitionController):
                why = PARTITION_REFUSED.get(fault.action.side, why)
            raise ValueError(
                f"{scenario.path}:{fault.line}: this fault ({action}) is not supported in real "
                f"mode yet" + (f": {why}" if why else "")
            )
