"""The scenario loader's fault timeline, and the names every later section is checked against.

Role: `Known` holds what a scenario has defined so far (nodes and their GPU counts, fabrics,
deployed models, fault ids and their times) and turns reference nodes into checked ids and time
nodes into milliseconds. `load_faults` reads `faults:` into sorted `Fault`s.

Invariants:
- A reference is accepted only if it names something defined; the error points at the value.
- Fault ids are unique names that cannot be mistaken for `start`, `end` or a duration.
- A fault's `at` may name another fault; resolution follows references in dependency order,
  refuses cycles, and every resolved time lies in [0, duration].
- The result is sorted by time, ties in file order; `Fault.line` is the fault's first line.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from fractions import Fraction

from yaml.nodes import Node

from llmgw_twin.control.model import FabricId, ModelName, NodeId, ProfileName
from llmgw_twin.twin.scenario import yamlnodes as yn
from llmgw_twin.twin.scenario.fleet import ReplicaTotals
from llmgw_twin.twin.scenario.limits import MAX_FAULTS, MAX_NAME_LEN, MAX_REPLICAS
from llmgw_twin.twin.scenario.model import (
    FAULT_KEYS,
    ClockSkew,
    Cordon,
    CrashNode,
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
    StallController,
    StoreDown,
)
from llmgw_twin.twin.scenario.shapes import (
    SHAPE_KEYS,
    Added,
    check_added_first,
    shape_action,
    slow_factor,
)
from llmgw_twin.twin.scenario.timeexpr import (
    END,
    START,
    TimeCycle,
    TimeExpr,
    is_duration,
    parse_time,
    resolve_time,
    resolve_times,
)
from llmgw_twin.twin.scenario.topo_faults import TOPOLOGY_ACTION_KEYS, topology_action
from llmgw_twin.twin.scenario.topology import TopologyNames
from llmgw_twin.units import fmt_ms

MAX_TIME_LEN = MAX_NAME_LEN + 64
"""A time expression: an anchor (a name), a sign and a duration."""

_ACTIONS = tuple(FAULT_KEYS)
_FAULT_HINT = f"at, id and one action of: {', '.join(_ACTIONS)}"
_ACTION_KEYS: dict[str, tuple[str, ...]] = {
    "partition": ("nodes", "for"),
    "kill_engine": ("node", "replica_of"),
    "hang_engine": ("node", "replica_of"),
    "restart_controller": ("down_for", "controller"),
    "stall_controller": ("controller", "for"),
    "partition_controller": ("controller", "from", "for"),
    "store_down": ("for",),
    "clock_skew": ("controller", "rate"),
    "restart_agent": ("node", "down_for"),
    "fail_gpu": ("node", "gpu"),
    "fabric_down": ("fabric", "for"),
    "set_replicas": ("model", "replicas"),
    "set_profile": ("model", "profile"),
    **SHAPE_KEYS,
    **TOPOLOGY_ACTION_KEYS,
}


@dataclass(frozen=True, slots=True)
class Known:
    """What references may name. Dicts and lists keep file order; lookups only, no set walks."""

    duration_ms: int
    node_gpus: dict[str, int]
    fabrics: dict[str, None]
    """Keys only: a dict keeps file order and looks a name up at once, in fleets of any size."""
    models: dict[str, None]
    totals: ReplicaTotals = field(default_factory=ReplicaTotals)
    """Grows with each `set_replicas` above a deployment's count so far."""
    fault_at_ms: dict[str, int] = field(default_factory=dict)
    traffic: dict[str, None] = field(default_factory=dict)
    """The models `traffic:` sends requests to (known once that section is read)."""
    controllers: int = 1
    added: Added = field(default_factory=dict)
    """Every `add_node` of the file (`shapes.prescan_added`); their names are in `node_gpus`."""
    profiles: dict[str, int] = field(default_factory=dict)
    """The profiles `profiles:` defines (what `set_profile` may name), each with its `nodes`."""
    topology: TopologyNames = field(default_factory=TopologyNames)
    """The leaves, spines and NVLink domains of `cluster.topology` (what topology faults name)."""
    grouped: dict[str, None] = field(default_factory=dict)
    """The models deployed in roles (`set_profile` may not name them)."""

    def controller(self, node: Node, where: str, leader: bool = True) -> str:
        """A controller's name: `c1`..`cK` (and `leader`, where whichever leads is meant)."""
        value = _ref(node, where)
        names = [f"c{i + 1}" for i in range(self.controllers)]
        if value in names or (leader and value == "leader"):
            return value
        allowed = [*names, "leader"] if leader else names
        raise yn.Invalid.at(
            node, f"{where}: unknown controller '{value}' (known: {yn.preview(allowed)})"
        )

    def ungrouped(self, node: Node, where: str) -> ModelName:
        """A deployed model that is not deployed in roles (whose profiles cannot change)."""
        model = self.model(node, where)
        if model in self.grouped:
            raise yn.Invalid.at(
                node,
                f"{where}: '{model}' is deployed in roles, whose profiles cannot change in "
                "place (set_replicas scales its groups)",
            )
        return model

    def node(self, node: Node, where: str) -> NodeId:
        value = _ref(node, where)
        if value not in self.node_gpus:
            raise yn.Invalid.at(
                node, f"{where}: unknown node '{value}' (known: {yn.preview(list(self.node_gpus))})"
            )
        return NodeId(value)

    def fabric(self, node: Node, where: str) -> FabricId:
        value = _ref(node, where)
        if value not in self.fabrics:
            raise yn.Invalid.at(
                node, f"{where}: unknown fabric '{value}' (known: {yn.preview(list(self.fabrics))})"
            )
        return FabricId(value)

    def model(self, node: Node, where: str) -> ModelName:
        value = _ref(node, where)
        if value not in self.models:
            raise yn.Invalid.at(
                node,
                f"{where}: '{value}' is not a deployed model "
                f"(deployed: {yn.preview(list(self.models))})",
            )
        return ModelName(value)

    def profile(self, node: Node, where: str) -> ProfileName:
        value = _ref(node, where)
        if value not in self.profiles:
            raise yn.Invalid.at(
                node,
                f"{where}: unknown profile '{value}' (defined: {yn.preview(list(self.profiles))})",
            )
        return ProfileName(value)

    def fault_id(self, node: Node, where: str) -> str:
        value = _ref(node, where)
        if value not in self.fault_at_ms:
            raise yn.Invalid.at(
                node,
                f"{where}: unknown fault id '{value}' "
                f"(known: {yn.preview(list(self.fault_at_ms))})",
            )
        return value

    def time(self, node: Node, where: str, past_end: bool = False) -> tuple[TimeExpr, int]:
        """A time expression whose fault ids are all resolved, checked to lie inside the run;
        with `past_end`, a time after the end is taken as the end (a window's closing time)."""
        expr = _parse(node, where, self.fault_at_ms)
        ms = resolve_time(expr, self.fault_at_ms, self.duration_ms)
        if past_end and ms > self.duration_ms:
            return expr, self.duration_ms
        self.check_in_run(node, where, expr, ms)
        return expr, ms

    def check_in_run(self, node: Node, where: str, expr: TimeExpr, ms: int) -> None:
        if not 0 <= ms <= self.duration_ms:
            raise yn.Invalid.at(
                node,
                f"{where}: '{expr.text}' is {fmt_ms(ms)}, outside the run "
                f"[{fmt_ms(0)}, {fmt_ms(self.duration_ms)}]",
            )


def _ref(node: Node, where: str) -> str:
    """A reference to a name: its text, no longer than a name may be."""
    return yn.text(node, where, MAX_NAME_LEN, "names")


def _parse(node: Node, where: str, fault_ids: Collection[str]) -> TimeExpr:
    """A time as written: a name, a sign and a duration at most, hence its length bound."""
    try:
        return parse_time(yn.text(node, where, MAX_TIME_LEN, "times"), fault_ids)
    except ValueError as err:
        raise yn.Invalid.at(node, f"{where}: {err}") from None


@dataclass(frozen=True, slots=True)
class _Raw:
    """One fault as written, before its time is known."""

    where: str
    line: int
    id: str | None
    at_node: Node
    action: FaultAction


def load_faults(node: Node, known: Known) -> tuple[tuple[Fault, ...], Known]:
    """The sorted faults, and `known` extended with every fault id's time."""
    raws: list[_Raw] = []
    index_of: dict[str, int] = {}
    for i, item in enumerate(yn.items(node, "faults", MAX_FAULTS)):
        where = f"faults[{i}]"
        view = yn.MapView(item, where)
        view.check_keys(("at", "id", *_ACTIONS), _FAULT_HINT)
        actions = [e for e in view.entries if e.key in FAULT_KEYS]
        if not actions:
            raise yn.Invalid.at(
                item, f"{where} has no action (expected one of: {', '.join(_ACTIONS)})"
            )
        if len(actions) > 1:
            raise yn.Invalid.at(
                actions[1].key_node,
                f"{where} has two actions, '{actions[0].key}' and '{actions[1].key}' "
                "(write one fault per action)",
            )
        fault_id: str | None = None
        if (id_node := view.get("id")) is not None:
            fault_id = _new_id(id_node, f"{where}.id", index_of, raws)
            index_of[fault_id] = i
        at_node = view.require("at")
        action = _action(actions[0].key, actions[0].value, f"{where}.{actions[0].key}", known)
        raws.append(_Raw(where, yn.line_of(item), fault_id, at_node, action))

    exprs = [_parse(r.at_node, f"{r.where}.at", index_of) for r in raws]
    try:
        times = resolve_times(exprs, index_of, known.duration_ms)
    except TimeCycle as cycle:
        first = min(cycle.members)
        loop = [*cycle.members[cycle.members.index(first) :], *cycle.members]
        names = " -> ".join(str(raws[m].id) for m in loop[: len(cycle.members) + 1])
        raise yn.Invalid.at(
            raws[first].at_node,
            f"{raws[first].where}.at: fault times refer to each other in a loop ({names})",
        ) from None
    for raw, expr, ms in zip(raws, exprs, times, strict=True):
        known.check_in_run(raw.at_node, f"{raw.where}.at", expr, ms)
    order = sorted(range(len(raws)), key=lambda i: (times[i], i))
    faults = tuple(Fault(times[i], raws[i].action, raws[i].id, raws[i].line) for i in order)
    if known.added:
        check_added_first(faults, {r.line: r.at_node for r in raws})
    fault_at_ms = {r.id: t for r, t in zip(raws, times, strict=True) if r.id is not None}
    return faults, replace(known, fault_at_ms=fault_at_ms)


def _new_id(node: Node, where: str, index_of: dict[str, int], raws: list[_Raw]) -> str:
    fault_id = yn.name(node, where, "fault id")
    if fault_id in (START, END) or is_duration(fault_id):
        raise yn.Invalid.at(
            node,
            f"{where}: '{fault_id}' cannot be a fault id, it already means a time "
            "(pick a name such as 'kill')",
        )
    if fault_id in index_of:
        first = raws[index_of[fault_id]]
        raise yn.Invalid.at(
            node, f"{where}: fault id '{fault_id}' is used twice (first at line {first.line})"
        )
    return fault_id


CONTROLLER_SIDES = ("store", "agents", "peers", "all")
MAX_CLOCK_RATE = Fraction(10)


def _rate(node: Node, where: str) -> tuple[int, int]:
    """A clock rate such as `1.05` or `0.9`, exactly as written: above 0, at most 10."""
    text = yn.text(node, where, 32, "rates")
    try:
        rate = Fraction(text)
    except (ValueError, ZeroDivisionError):
        raise yn.Invalid.at(node, f"{where}: expected a rate such as 1.05 or 0.9") from None
    if not 0 < rate <= MAX_CLOCK_RATE:
        raise yn.Invalid.at(node, f"{where}: a rate must be above 0 and at most {MAX_CLOCK_RATE}")
    return rate.numerator, rate.denominator


def _action(key: str, value: Node, where: str, known: Known) -> FaultAction:
    if key == "kill_node":
        return KillNode(known.node(value, where))
    if key == "crash_node":
        return CrashNode(known.node(value, where))
    if key == "restart_node":
        return RestartNode(known.node(value, where))
    if key in ("cordon", "uncordon", "drain"):
        return Cordon(known.node(value, where), key)
    if key == "delete_deployment":
        return DeleteDeployment(known.model(value, where))
    if key == "kill_controller":
        return KillController(known.controller(value, where))
    view = yn.MapView(value, where)
    view.check_keys(_ACTION_KEYS.get(key, ()))

    def need(sub: str) -> tuple[Node, str]:
        return view.require(sub), f"{where}.{sub}"

    match key:
        case "partition":
            nodes_node, nodes_where = need("nodes")
            members = yn.items(nodes_node, nodes_where)
            if not members:
                raise yn.Invalid.at(nodes_node, f"{nodes_where} must name at least one node")
            nodes: dict[NodeId, None] = {}  # file order; a dict finds repeats at once
            for i, member in enumerate(members):
                node_id = known.node(member, f"{nodes_where}[{i}]")
                if node_id in nodes:
                    raise yn.Invalid.at(member, f"{nodes_where}: node '{node_id}' is listed twice")
                nodes[node_id] = None
            return Partition(tuple(nodes), yn.duration(*need("for"), positive=True))
        case "kill_engine":
            return KillEngine(known.node(*need("node")), known.model(*need("replica_of")))
        case "hang_engine":
            return HangEngine(known.node(*need("node")), known.model(*need("replica_of")))
        case "restart_agent":
            return RestartAgent(known.node(*need("node")), yn.duration(*need("down_for")))
        case "restart_controller":
            named = view.get("controller")
            who = None if named is None else known.controller(named, f"{where}.controller")
            return RestartController(yn.duration(*need("down_for")), who)
        case "stall_controller" | "partition_controller" | "store_down" | "clock_skew":
            return _controller_action(key, need, known)
        case "cut_fabric_link" | "slow_node" | "delay_heartbeats" | "add_node":
            return shape_action(key, value, need, known.node, known.added)
        case "leaf_down" | "spine_down" | "nvlink_domain_down" | "nvlink_degraded":
            return topology_action(key, view, where, known.node, known.topology, slow_factor)
        case "fail_gpu":
            node_id = known.node(*need("node"))
            gpu_node, gpu_where = need("gpu")
            gpu = yn.integer(gpu_node, gpu_where, minimum=0)
            count = known.node_gpus[node_id]
            if gpu >= count:
                have = f"GPUs 0..{count - 1}" if count else "no GPUs"
                raise yn.Invalid.at(gpu_node, f"{gpu_where}: {node_id} has {have}, not GPU {gpu}")
            return FailGpu(node_id, gpu)
        case "fabric_down":
            fabric = known.fabric(*need("fabric"))
            return FabricDown(fabric, yn.duration(*need("for"), positive=True))
        case "set_replicas":
            model = known.model(*need("model"))
            replicas_node, replicas_where = need("replicas")
            replicas = yn.integer(replicas_node, replicas_where, minimum=0, maximum=MAX_REPLICAS)
            known.totals.raise_to(model, replicas, replicas_node, replicas_where)
            return SetReplicas(model, replicas)
        case "set_profile":
            model = known.ungrouped(*need("model"))
            profile_node, profile_where = need("profile")
            profile = known.profile(profile_node, profile_where)
            known.totals.widen(model, known.profiles[profile], profile_node, profile_where)
            return SetProfile(model, profile)
    # Only reachable if scenario.FAULT_KEYS grows before this reader does.
    raise yn.Invalid.at(value, f"{where}: this loader cannot read '{key}' faults yet")


def _controller_action(
    key: str, need: Callable[[str], tuple[Node, str]], known: Known
) -> FaultAction:
    """A controller's own fault (version 1.2) other than a kill or a restart."""
    match key:
        case "stall_controller":
            who = known.controller(*need("controller"))
            return StallController(who, yn.duration(*need("for"), positive=True))
        case "partition_controller":
            who = known.controller(*need("controller"))
            side_node, side_where = need("from")
            side = yn.text(side_node, side_where, MAX_NAME_LEN, "names")
            if side not in CONTROLLER_SIDES:
                raise yn.Invalid.at(
                    side_node,
                    f"{side_where}: '{yn.short(side)}' is not a side "
                    f"(expected one of: {', '.join(CONTROLLER_SIDES)})",
                )
            return PartitionController(who, side, yn.duration(*need("for"), positive=True))
        case "store_down":
            return StoreDown(yn.duration(*need("for"), positive=True))
        case "clock_skew":
            who = known.controller(*need("controller"))
            num, den = _rate(*need("rate"))
            return ClockSkew(who, num, den)
    raise AssertionError(key)
