"""The fault timeline: each fault fires at its instant, is recorded, and changes the world.

Faults act on the world the way the real thing would, never on the controller's memory: a killed
node just stops (its agent and engines vanish, no more heartbeats), a crashed node stops too but
its peers see their connections close, a partition cuts links, an engine crash is an exit the
agent sees, a hung engine is one its agent's probe finds silent, a fabric outage is a link state
the agents' inventories see, a controller restart kills the controller process (its store
survives). The operator's actions (`set_replicas`, `set_profile`, cordons and drains, a
deployment deleted) go through the controller's admin entry point like an API call.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from functools import partial
from typing import assert_never

from llmgw_twin.control import protocol
from llmgw_twin.control.model import Deployment, FabricId, NodeId, TraceEvent
from llmgw_twin.control.protocol import (
    ApplyDeployment,
    ControllerEvent,
)
from llmgw_twin.twin.scenario.model import (
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
from llmgw_twin.twin.world.controller import ControllerShell
from llmgw_twin.twin.world.leader import ControllerProcess
from llmgw_twin.twin.world.shapes import shape_fault
from llmgw_twin.twin.world.sim import World
from llmgw_twin.twin.world.topo_faults import topology_fault

ENGINE_CRASH_EXIT_CODE = 137
"""What a killed engine process exits with (128 + SIGKILL)."""


def _action_name(fault: Fault) -> str:
    for key, cls in FAULT_KEYS.items():
        if isinstance(fault.action, cls):
            return key
    raise AssertionError(fault.action)


def schedule_faults(
    scenario: Scenario,
    world: World,
    controller: ControllerShell,
    trace: list[TraceEvent],
) -> None:
    """Put every fault of the scenario on the timeline (the twin models every action)."""
    deployments = {d.model: d for d in scenario.deployments}

    cuts: dict[NodeId, int] = {}
    downs: dict[FabricId, int] = {}

    def inject(fault: Fault) -> None:
        subjects = fault_subjects(fault)
        trace.append(TraceEvent.of(world.now, "fault.injected", fault=fault.id, **subjects))
        match fault.action:
            case KillNode(node=node):
                world.nodes[node].kill()
            case CrashNode(node=node):
                world.nodes[node].crash()
            case RestartNode(node=node):
                world.nodes[node].boot()
            case RestartAgent(node=node, down_for_ms=down_for_ms):
                world.nodes[node].restart_agent(down_for_ms)
            case SetReplicas(model=model, replicas=replicas):
                dep = deployments[model]
                deployments[model] = replace(dep, replicas=replicas)
                controller.operator(ApplyDeployment(deployments[model]))
            case SetProfile(model=model, profile=profile):
                dep = deployments[model]
                deployments[model] = Deployment(dep.model, profile, dep.replicas)
                controller.operator(ApplyDeployment(deployments[model]))
            case Cordon() | DeleteDeployment():
                controller.operator(_operator_call(fault.action))
            case Partition(nodes=nodes, for_ms=for_ms):
                for node in nodes:  # overlapping partitions: the link heals with the last
                    _cut_off(world, cuts, node)
                world.later(for_ms, lambda: _heal(world, nodes, cuts))
            case RestartController(down_for_ms=down_for_ms, controller=name):
                proc = controller.crash(name)
                world.later(down_for_ms, lambda: controller.restart(proc))
            case (
                KillController() | StallController() | PartitionController() | StoreDown()
            ) | ClockSkew():
                _controller_fault(world, controller, fault.action)
            case FailGpu(node=node, gpu=gpu):
                world.nodes[node].fail_gpu(gpu)
            case FabricDown(fabric=fabric, for_ms=for_ms):
                _fabric_down(world, fabric, for_ms, downs)
            case KillEngine() | HangEngine():
                _engine_fault(world, fault.action)
            case CutFabricLink() | SlowNode() | DelayHeartbeats() | AddNode():
                shape_fault(world, fault.action)
            case LeafDown() | SpineDown() | NvlinkDomainDown() | NvlinkDegraded():
                cut, heal = partial(_cut_off, world, cuts), partial(_heal_one, world, cuts)
                topology_fault(world, fault.action, cut, heal)
            case _:
                assert_never(fault.action)

    for fault in scenario.faults:
        world.later(fault.at_ms, lambda f=fault: inject(f))  # type: ignore[misc]


def _engine_fault(world: World, action: KillEngine | HangEngine) -> None:
    """The first engine (by replica id, rank) of the model on the node dies, or hangs (one not
    hung already)."""
    sim_node = world.nodes[action.node]
    for engine in sim_node.engines_sorted():
        if engine.spec.model != action.replica_of:
            continue
        if isinstance(action, KillEngine):
            sim_node.kill_engine(engine.key, ENGINE_CRASH_EXIT_CODE)
            return
        if not engine.hung:
            sim_node.hang_engine(engine.key)
            return


def _controller_fault(
    world: World,
    controller: ControllerShell,
    action: KillController | StallController | PartitionController | StoreDown | ClockSkew,
) -> None:
    match action:
        case KillController(controller=name):
            controller.crash(name)
        case StallController(controller=name, for_ms=for_ms):
            controller.named(name).stall(for_ms)
        case PartitionController(controller=name, side=side, for_ms=for_ms):
            _cut_controller(world, controller.named(name), side, for_ms)
        case StoreDown(for_ms=for_ms):
            controller.store_outage(for_ms)
        case ClockSkew(controller=name, rate_num=num, rate_den=den):
            controller.named(name).skew(Fraction(num, den))
        case _:
            assert_never(action)


def _cut_controller(world: World, proc: ControllerProcess, side: str, for_ms: int) -> None:
    """`proc` and `side` cannot reach each other for `for_ms` (the controllers meet only
    through the store, so a cut from its peers changes nothing they do)."""
    store = side in ("store", "all")
    agents = side in ("agents", "all")
    if agents:
        world.heartbeats.land_all()  # its agents' heartbeats stop reaching it: not quiet
    proc.cut_store += store
    proc.cut_agents += agents

    def heal() -> None:
        proc.cut_store -= store
        proc.cut_agents -= agents

    world.later(for_ms, heal)


def _fabric_down(world: World, fabric: FabricId, for_ms: int, downs: dict[FabricId, int]) -> None:
    downs[fabric] = downs.get(fabric, 0) + 1
    world.network.cut_fabric(fabric)
    for node in world.network.fabric_links(fabric):
        world.nodes[node].fabric_link(False)  # the inventory sees the ports go down
        world.nodes[node].lose_peers()
    world.later(for_ms, lambda: _restore(world, fabric, downs))


def _restore(world: World, fabric: FabricId, downs: dict[FabricId, int]) -> None:
    downs[fabric] -= 1
    if downs[fabric] == 0:  # overlapping outages: the links come back with the last
        world.network.restore_fabric(fabric)
        for node in world.network.fabric_links(fabric):
            if world.network.fabric_link_up(node):  # not one whose own link is still cut
                world.nodes[node].fabric_link(True)


def _operator_call(action: Cordon | DeleteDeployment) -> ControllerEvent:
    """The admin API call an operator action of a scenario is."""
    match action:
        case Cordon(node=node, op="drain"):
            return protocol.Drain(node)
        case Cordon(node=node, op=op):
            return protocol.Cordon(node, cordoned=op == "cordon")
        case DeleteDeployment(model=model):
            return protocol.DeleteDeployment(model)
        case _:
            assert_never(action)


def _cut_off(world: World, cuts: dict[NodeId, int], node: NodeId) -> None:
    """`node`'s management link is cut (by a partition, or its leaf switch)."""
    world.heartbeats.land(node)  # its heartbeats stop reaching the controller
    cuts[node] = cuts.get(node, 0) + 1
    world.network.cut_from_controller(node)


def _heal_one(world: World, cuts: dict[NodeId, int], node: NodeId) -> None:
    _heal(world, (node,), cuts)


def _heal(world: World, nodes: tuple[NodeId, ...], cuts: dict[NodeId, int]) -> None:
    for node in nodes:
        cuts[node] -= 1
        if cuts[node] == 0:
            world.network.rejoin_controller(node)


def fault_subjects(fault: Fault) -> dict[str, object]:
    match fault.action:
        case KillNode(node=node) | CrashNode(node=node) | RestartNode(node=node):
            return {"action": _action_name(fault), "node": node}
        case SetReplicas(model=model, replicas=replicas):
            return {"action": "set_replicas", "model": model, "replicas": replicas}
        case SetProfile(model=model, profile=profile):
            return {"action": "set_profile", "model": model, "profile": profile}
        case Cordon(node=node, op=op):
            return {"action": op, "node": node}
        case DeleteDeployment(model=model):
            return {"action": "delete_deployment", "model": model}
        case Partition(nodes=nodes):
            return {"action": "partition", "nodes": nodes}
        case KillEngine(node=node, replica_of=model) | HangEngine(node=node, replica_of=model):
            return {"action": _action_name(fault), "node": node, "model": model}
        case RestartController(down_for_ms=down_for_ms, controller=name):
            named = {} if name is None else {"controller": name}
            return {"action": "restart_controller", "down_for_ms": down_for_ms, **named}
        case KillController(controller=name):
            return {"action": "kill_controller", "controller": name}
        case StallController(controller=name):
            return {"action": "stall_controller", "controller": name}
        case PartitionController(controller=name, side=side):
            return {"action": "partition_controller", "controller": name, "side": side}
        case StoreDown():
            return {"action": "store_down"}
        case ClockSkew(controller=name):
            return {"action": "clock_skew", "controller": name}
        case RestartAgent(node=node, down_for_ms=down_for_ms):
            return {"action": "restart_agent", "node": node, "down_for_ms": down_for_ms}
        case FailGpu(node=node, gpu=gpu):
            return {"action": "fail_gpu", "node": node, "gpu": gpu}
        case FabricDown(fabric=fabric):
            return {"action": "fabric_down", "fabric": fabric}
        case CutFabricLink(node=node) | SlowNode(node=node):
            return {"action": _action_name(fault), "node": node}
        case DelayHeartbeats(nodes=nodes, by_ms=by_ms):
            return {"action": "delay_heartbeats", "nodes": nodes, "delay_ms": by_ms}
        case AddNode(info=info):
            return {"action": "add_node", "node": info.node, "fabric": info.fabric}
        case LeafDown(leaf=leaf, nodes=nodes):
            return {"action": "leaf_down", "leaf": leaf, "nodes": nodes}
        case SpineDown(spine=spine, leaves=leaves):
            return {"action": "spine_down", "spine": spine, "leaves": tuple(x for x, _ in leaves)}
        case NvlinkDomainDown(domain=domain, nodes=nodes):
            return {"action": "nvlink_domain_down", "domain": domain, "nodes": nodes}
        case NvlinkDegraded(node=node):
            return {"action": "nvlink_degraded", "node": node}
        case _:
            assert_never(fault.action)
