"""Placement under a profile's topology rules: literal fleets, and properties over random ones."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw_twin.control.model import EngineName, FabricId, NodeId, NodeInfo, Profile, ProfileName
from llmgw_twin.control.placement import CapacityIndex, Placement, Unplaceable
from llmgw_twin.control.topology import DomainId, LeafId, NodeTopology, TopologyRules

SIM = EngineName("sim")


def info(name: str, fabric: str, gpus: int, leaf: str | None, domain: str | None) -> NodeInfo:
    topo = NodeTopology(LeafId(leaf) if leaf else None, None, DomainId(domain) if domain else None)
    return NodeInfo(NodeId(name), FabricId(fabric), gpus, 81920, (SIM,), topo)


def fleet(*infos: NodeInfo) -> CapacityIndex:
    idx = CapacityIndex()
    for i in infos:
        idx.add_node(i)
        idx.set_schedulable(i.node, True)
    return idx


def prof(nodes: int, gpus: int, nvlink: str = "any", leaves: str = "any") -> Profile:
    return Profile(ProfileName("p"), SIM, nodes, gpus, "/m", topology=TopologyRules(nvlink, leaves))


def book(idx: CapacityIndex, p: Placement) -> None:
    for n, gpus in zip(p.nodes, p.gpus, strict=True):
        idx.book(n, gpus)


CROSSED = (
    info("node01", "ib-a", 8, "leaf-1", "nvl-1"),
    info("node02", "ib-a", 8, "leaf-1", "nvl-2"),
    info("node03", "ib-a", 8, "leaf-2", "nvl-1"),
    info("node04", "ib-a", 8, "leaf-2", "nvl-2"),
)


def test_without_rules_placement_ignores_the_topology() -> None:
    p = fleet(*CROSSED).place(prof(2, 8), {})
    assert isinstance(p, Placement) and p.nodes == ("node01", "node02")


def test_same_domain_keeps_a_replica_in_one_nvlink_domain() -> None:
    idx = fleet(*CROSSED)
    first = idx.place(prof(2, 8, nvlink="same_domain"), {})
    assert isinstance(first, Placement) and first.nodes == ("node01", "node03")
    book(idx, first)
    second = idx.place(prof(2, 8, nvlink="same_domain"), {})
    assert isinstance(second, Placement) and second.nodes == ("node02", "node04")
    book(idx, second)
    third = idx.place(prof(1, 8, nvlink="same_domain"), {})
    assert isinstance(third, Unplaceable)


def test_same_domain_refuses_nodes_outside_every_domain() -> None:
    idx = fleet(info("a", "ib-a", 8, None, None), info("b", "ib-a", 8, None, None))
    out = idx.place(prof(2, 4, nvlink="same_domain"), {})
    assert isinstance(out, Unplaceable)
    assert "in one NVLink domain" in out.reason
    assert "ib-a/a has 1" in out.reason
    # one node needs no NVLink peer: it is a domain of its own
    assert isinstance(idx.place(prof(1, 4, nvlink="same_domain"), {}), Placement)


def test_leaves_same_and_fewest() -> None:
    idx = fleet(*CROSSED)
    same = idx.place(prof(2, 8, leaves="same"), {})
    assert isinstance(same, Placement) and same.nodes == ("node01", "node02")
    assert isinstance(idx.place(prof(3, 8, leaves="same"), {}), Unplaceable)
    fewest = idx.place(prof(3, 8, leaves="fewest"), {})
    assert isinstance(fewest, Placement)
    leaves = {idx.topology_of(n).leaf for n in fewest.nodes}  # type: ignore[union-attr]
    assert len(leaves) == 2


def test_fewest_leaves_prefers_one_leaf_over_name_order() -> None:
    idx = fleet(
        info("a1", "ib-a", 8, "leaf-1", None),
        info("b1", "ib-a", 8, "leaf-2", None),
        info("b2", "ib-a", 8, "leaf-2", None),
    )
    plain = idx.place(prof(2, 8), {})
    assert isinstance(plain, Placement) and plain.nodes == ("a1", "b1")
    out = idx.place(prof(2, 8, leaves="fewest"), {})
    assert isinstance(out, Placement) and sorted(out.nodes) == ["b1", "b2"]


def test_fewest_leaves_across_fabrics_picks_the_fabric_with_one_leaf() -> None:
    idx = fleet(
        info("a1", "ib-a", 8, "la1", None),
        info("a2", "ib-a", 8, "la2", None),
        info("b1", "ib-b", 8, "lb1", None),
        info("b2", "ib-b", 8, "lb1", None),
    )
    out = idx.place(prof(2, 8, leaves="fewest"), {})
    assert isinstance(out, Placement) and out.fabric == "ib-b"


@st.composite
def fleets(draw: st.DrawFn) -> list[NodeInfo]:
    count = draw(st.integers(2, 16))
    out = []
    for i in range(count):
        fabric = draw(st.sampled_from(("ib-a", "ib-b")))
        leaf = draw(st.sampled_from((None, "l1", "l2", "l3")))
        domain = draw(st.sampled_from((None, "d1", "d2")))
        gpus = draw(st.sampled_from((2, 4, 8)))
        out.append(info(f"n{i:02d}", fabric, gpus, f"{fabric}-{leaf}" if leaf else None, domain))
    return out


@settings(max_examples=150, deadline=None)
@given(
    fleets(),
    st.lists(st.tuples(st.integers(1, 3), st.sampled_from((1, 2, 4, 8))), min_size=1, max_size=8),
    st.sampled_from(("any", "same_domain")),
    st.sampled_from(("any", "same", "fewest")),
)
def test_rules_always_hold_and_no_gpu_is_booked_twice(
    infos: list[NodeInfo],
    shapes: list[tuple[int, int]],
    nvlink: str,
    leaves: str,
) -> None:
    idx = fleet(*infos)
    by_name = {i.node: i for i in infos}
    for nodes, gpus in shapes:
        p = idx.place(prof(nodes, gpus, nvlink, leaves), {})
        if isinstance(p, Unplaceable):
            continue
        book(idx, p)  # raises if a GPU is not free
        assert len(set(p.nodes)) == nodes
        assert {by_name[n].fabric for n in p.nodes} == {p.fabric}
        topo = [by_name[n].topology or NodeTopology() for n in p.nodes]
        if nvlink == "same_domain" and nodes > 1:
            assert len({t.nvlink_domain for t in topo}) == 1
            assert topo[0].nvlink_domain is not None
        if leaves == "same" and nodes > 1:
            assert len({t.leaf for t in topo}) == 1
            assert topo[0].leaf is not None


def test_a_node_reregistered_keeps_its_topology_in_the_book() -> None:
    idx = fleet(*CROSSED)
    moved = replace(CROSSED[1], topology=NodeTopology(LeafId("leaf-1"), None, DomainId("nvl-1")))
    idx.add_node(moved)
    idx.set_schedulable(moved.node, True)
    out = idx.place(prof(3, 8, nvlink="same_domain"), {})
    assert isinstance(out, Placement) and sorted(out.nodes) == ["node01", "node02", "node03"]
