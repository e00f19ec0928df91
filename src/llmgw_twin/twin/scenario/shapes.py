"""The scenario loader's fault shapes real fleets show (version 1.2): `cut_fabric_link`,
`slow_node`, `delay_heartbeats` and `add_node`.

Role: `prescan_added` reads every `add_node` of `faults:` before anything else of the file, so an
added node's name may be used by any fault or expectation, wherever it is written; its settings
are the fleet's node defaults (`cluster.nodes.default`) with the fault's `gpus` and `engines` over
them. `shape_action` reads one of the four actions once the names are known.

Invariants:
- An added node's name is new (not in the fleet, not added twice), its fabric is one the file
  defines, and the fleet with it stays within `MAX_NODES` and `MAX_FLEET_GPUS`.
- A slowdown factor is exact (a fraction of integers, as written) in [1, `MAX_SLOW_FACTOR`].
- No fault may touch an added node before it is added (`check_added_first`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fractions import Fraction

from yaml.nodes import MappingNode, Node, ScalarNode

from llmgw_twin.control.model import EngineName, FabricId, NodeId, NodeInfo
from llmgw_twin.twin.scenario import yamlnodes as yn
from llmgw_twin.twin.scenario.fleet import read_engines
from llmgw_twin.twin.scenario.limits import (
    MAX_FAULTS,
    MAX_FLEET_GPUS,
    MAX_GPUS_PER_NODE,
    MAX_NAME_LEN,
    MAX_NODES,
)
from llmgw_twin.twin.scenario.model import (
    AddNode,
    CutFabricLink,
    DelayHeartbeats,
    Fault,
    FaultAction,
    SlowNode,
)

SHAPE_KEYS: dict[str, tuple[str, ...]] = {
    "cut_fabric_link": ("node", "for"),
    "slow_node": ("node", "factor", "for"),
    "delay_heartbeats": ("nodes", "by", "for"),
    "add_node": ("node", "fabric", "gpus", "engines"),
}
"""Each shape's keys, as `faults._ACTION_KEYS` gives the other actions'."""

MAX_SLOW_FACTOR = Fraction(100)
"""The most a node may be slowed down: a straggler, not a node that stopped."""

Added = dict[Node, NodeInfo]
"""Each `add_node` value (the YAML node, by identity) -> the node it adds."""


def prescan_added(
    faults: Node | None,
    fabrics: Sequence[tuple[FabricId, tuple[NodeId, ...]]],
    fleet: Sequence[NodeInfo],
    defaults: tuple[int, int, tuple[EngineName, ...]],
) -> Added:
    """Every `add_node` of `faults:`, in file order. Anything else of the section is left to
    `load_faults` (a malformed fault is reported there)."""
    out: Added = {}
    if faults is None:
        return out
    names = {n.node for n in fleet}
    known_fabrics = [f for f, _ in fabrics]
    gpus_total = sum(n.gpus for n in fleet)
    for i, item in enumerate(yn.items(faults, "faults", MAX_FAULTS)):
        if not isinstance(item, MappingNode):
            continue
        for key, value in item.value:
            if not (isinstance(key, ScalarNode) and key.value == "add_node"):
                continue
            where = f"faults[{i}].add_node"
            info = _added(value, where, known_fabrics, defaults)
            if info.node in names:
                raise yn.Invalid.at(
                    yn.MapView(value, where).require("node"),
                    f"{where}.node: '{info.node}' is already a node of the fleet "
                    "(an added node needs a new name)",
                )
            if len(names) >= MAX_NODES:
                raise yn.Invalid.at(
                    value, f"{where}: more than {MAX_NODES:,} nodes (the most a fleet may have)"
                )
            gpus_total += info.gpus
            if gpus_total > MAX_FLEET_GPUS:
                raise yn.Invalid.at(
                    value, f"{where}: the fleet would have more than {MAX_FLEET_GPUS:,} GPUs"
                )
            names.add(info.node)
            out[value] = info
    return out


def _added(
    value: Node,
    where: str,
    fabrics: list[FabricId],
    defaults: tuple[int, int, tuple[EngineName, ...]],
) -> NodeInfo:
    view = yn.MapView(value, where)
    view.check_keys(SHAPE_KEYS["add_node"])
    name = NodeId(yn.name(view.require("node"), f"{where}.node", "node name"))
    fabric_node = view.require("fabric")
    fabric = yn.text(fabric_node, f"{where}.fabric", MAX_NAME_LEN, "names")
    if fabric not in fabrics:
        raise yn.Invalid.at(
            fabric_node,
            f"{where}.fabric: unknown fabric '{fabric}' (known: {yn.preview(list(fabrics))})",
        )
    gpus, memory_mib, engines = defaults
    if (gpus_node := view.get("gpus")) is not None:
        gpus = yn.integer(gpus_node, f"{where}.gpus", minimum=0, maximum=MAX_GPUS_PER_NODE)
    if (engines_node := view.get("engines")) is not None:
        engines = read_engines(engines_node, f"{where}.engines")
    return NodeInfo(name, FabricId(fabric), gpus, memory_mib, engines)


def _factor(node: Node, where: str) -> Fraction:
    """A slowdown such as `3` or `2.5`, exactly as written: at least 1, at most 100."""
    text = yn.text(node, where, 32, "factors")
    try:
        factor = Fraction(text)
    except (ValueError, ZeroDivisionError):
        raise yn.Invalid.at(node, f"{where}: expected a factor such as 3 or 2.5") from None
    if not 1 <= factor <= MAX_SLOW_FACTOR:
        raise yn.Invalid.at(
            node, f"{where}: a slowdown factor must be at least 1 and at most {MAX_SLOW_FACTOR}"
        )
    return factor


def slow_factor(node: Node, where: str) -> tuple[int, int]:
    """A slowdown factor as `slow_node` reads it, as a fraction's numerator and denominator."""
    factor = _factor(node, where)
    return factor.numerator, factor.denominator


def shape_action(
    key: str,
    value: Node,
    need: Callable[[str], tuple[Node, str]],
    node_ref: Callable[[Node, str], NodeId],
    added: Added,
) -> FaultAction:
    """One of the four shapes; `need` reads a required key, `node_ref` checks a node's name."""
    match key:
        case "cut_fabric_link":
            return CutFabricLink(node_ref(*need("node")), yn.duration(*need("for"), positive=True))
        case "slow_node":
            node = node_ref(*need("node"))
            factor = _factor(*need("factor"))
            for_ms = yn.duration(*need("for"), positive=True)
            return SlowNode(node, factor.numerator, factor.denominator, for_ms)
        case "delay_heartbeats":
            nodes_node, nodes_where = need("nodes")
            members = yn.items(nodes_node, nodes_where)
            if not members:
                raise yn.Invalid.at(nodes_node, f"{nodes_where} must name at least one node")
            nodes: dict[NodeId, None] = {}
            for i, member in enumerate(members):
                node_id = node_ref(member, f"{nodes_where}[{i}]")
                if node_id in nodes:
                    raise yn.Invalid.at(member, f"{nodes_where}: node '{node_id}' is listed twice")
                nodes[node_id] = None
            by_ms = yn.duration(*need("by"), positive=True)
            return DelayHeartbeats(tuple(nodes), by_ms, yn.duration(*need("for"), positive=True))
        case "add_node":
            return AddNode(added[value])
    raise AssertionError(key)


def nodes_touched(action: FaultAction) -> tuple[NodeId, ...]:
    """The nodes a fault acts on by name (an added one must exist by then)."""
    if isinstance(action, AddNode):
        return ()
    one = getattr(action, "node", None)
    many = getattr(action, "nodes", None)
    return (*((one,) if isinstance(one, str) else ()), *(many if isinstance(many, tuple) else ()))


def check_added_first(faults: Sequence[Fault], lines: dict[int, Node]) -> None:
    """No fault touches an added node before the node is added (ties: the add comes first in
    the file). `lines` maps a fault's line to its `at` node, where the error points."""
    added_at: dict[NodeId, int] = {}
    for fault in faults:
        if isinstance(fault.action, AddNode):
            added_at[fault.action.info.node] = fault.at_ms
    if not added_at:
        return
    seen: set[NodeId] = set()
    for fault in faults:  # sorted by time, ties in file order
        if isinstance(fault.action, AddNode):
            seen.add(fault.action.info.node)
            continue
        for node in nodes_touched(fault.action):
            if node in added_at and node not in seen:
                raise yn.Invalid.at(
                    lines[fault.line],
                    f"fault at line {fault.line} acts on '{node}' before it is added "
                    "(add_node comes first)",
                )
