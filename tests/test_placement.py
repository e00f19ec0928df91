"""Placement on literal fleets, and properties over random fleets (Hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import node, profile
from llmgw_twin.control.model import FabricId, NodeId
from llmgw_twin.control.placement import REASON_FABRICS, CapacityIndex, Placement, Unplaceable
from llmgw_twin.control.room import Demand, Shape, capacity_of


def fleet(*infos: tuple[str, str, int]) -> CapacityIndex:
    idx = CapacityIndex()
    for name, fabric, gpus in infos:
        idx.add_node(node(name, fabric, gpus))
        idx.set_schedulable(NodeId(name), True)
    return idx


def book(idx: CapacityIndex, p: Placement) -> None:
    for n, gpus in zip(p.nodes, p.gpus, strict=True):
        idx.book(n, gpus)


def test_first_replica_takes_the_first_fabric_by_name_and_lowest_gpus() -> None:
    idx = fleet(("n2", "ib-b", 8), ("n1", "ib-a", 8), ("n3", "ib-a", 8), ("n4", "ib-b", 8))
    p = idx.place(profile(nodes=2, gpus=4), {})
    assert p == Placement(FabricId("ib-a"), (NodeId("n1"), NodeId("n3")), ((0, 1, 2, 3),) * 2)


def test_replicas_of_one_deployment_spread_across_fabrics_first() -> None:
    idx = fleet(("n1", "ib-a", 8), ("n2", "ib-a", 8), ("n3", "ib-b", 8), ("n4", "ib-b", 8))
    p = idx.place(profile(), {FabricId("ib-a"): 1})
    assert isinstance(p, Placement) and p.fabric == "ib-b"


def test_tightest_nodes_win_inside_a_fabric() -> None:
    idx = fleet(("big", "f", 8), ("small", "f", 4), ("mid", "f", 6))
    p = idx.place(profile(nodes=2, gpus=4), {})
    assert isinstance(p, Placement)
    assert p.nodes == ("small", "mid")


def test_a_replica_never_spans_fabrics_even_when_that_is_the_only_fit() -> None:
    idx = fleet(("n1", "ib-a", 8), ("n3", "ib-b", 8))
    p = idx.place(profile(nodes=2), {})
    assert isinstance(p, Unplaceable)
    assert "ib-a has 1" in p.reason and "ib-b has 1" in p.reason


def test_booked_gpus_and_unschedulable_nodes_are_not_offered() -> None:
    idx = fleet(("n1", "f", 8), ("n2", "f", 8), ("n3", "f", 8))
    first = idx.place(profile(nodes=2, gpus=6), {})
    assert isinstance(first, Placement)
    book(idx, first)
    idx.set_schedulable(NodeId("n3"), False)
    second = idx.place(profile(nodes=1, gpus=4), {})
    assert isinstance(second, Unplaceable)
    third = idx.place(profile(nodes=2, gpus=2), {})
    assert isinstance(third, Placement)
    assert third.gpus == ((6, 7), (6, 7))


def test_engine_must_be_onboarded_on_the_node() -> None:
    idx = CapacityIndex()
    idx.add_node(node("n1", "f", 8, engines=("vllm",)))
    idx.set_schedulable(NodeId("n1"), True)
    assert isinstance(idx.place(profile(nodes=1, engine="sim"), {}), Unplaceable)
    assert isinstance(idx.place(profile(nodes=1, engine="vllm"), {}), Placement)


def test_release_and_failed_gpus() -> None:
    idx = fleet(("n1", "f", 2))
    p = idx.place(profile(nodes=1, gpus=2), {})
    assert isinstance(p, Placement)
    book(idx, p)
    idx.fail_gpu(NodeId("n1"), 1)
    idx.release(NodeId("n1"), (0, 1))
    assert idx.free_gpus(NodeId("n1")) == (0,)
    assert isinstance(idx.place(profile(nodes=1, gpus=2), {}), Unplaceable)


# --- properties ------------------------------------------------------------------------------

fleets = st.lists(
    st.tuples(st.sampled_from(["fa", "fb", "fc"]), st.integers(min_value=0, max_value=8)),
    min_size=1,
    max_size=12,
)
profiles = st.lists(
    st.tuples(st.integers(min_value=1, max_value=4), st.integers(min_value=1, max_value=8)),
    min_size=1,
    max_size=10,
)


def can_hold(idx: CapacityIndex, nodes_by_fabric: dict[str, list[str]], n: int, g: int) -> bool:
    """Brute force: some fabric has n schedulable nodes with g free GPUs each."""
    return any(
        sum(1 for name in names if len(idx.free_gpus(NodeId(name))) >= g) >= n
        for names in nodes_by_fabric.values()
    )


@settings(max_examples=300, deadline=None)
@given(fleets, profiles)
def test_placement_never_spans_fabrics_never_double_books_and_places_whenever_possible(
    spec: list[tuple[str, int]], wants: list[tuple[int, int]]
) -> None:
    idx = CapacityIndex()
    fabric_of: dict[str, str] = {}
    by_fabric: dict[str, list[str]] = {}
    for i, (fabric, gpus) in enumerate(spec):
        name = f"n{i:02d}"
        fabric_of[name] = fabric
        by_fabric.setdefault(fabric, []).append(name)
        idx.add_node(node(name, fabric, gpus))
        idx.set_schedulable(NodeId(name), True)
    held: set[tuple[str, int]] = set()
    for n, g in wants:
        possible = can_hold(idx, by_fabric, n, g)
        result = idx.place(profile(nodes=n, gpus=g), {})
        if not possible:
            assert isinstance(result, Unplaceable)
            continue
        assert isinstance(result, Placement), "a fabric could hold it, yet it was not placed"
        assert len(set(result.nodes)) == n
        assert {fabric_of[x] for x in result.nodes} == {result.fabric}
        for x, got in zip(result.nodes, result.gpus, strict=True):
            assert len(got) == g
            for gpu in got:
                assert (x, gpu) not in held
                held.add((x, gpu))
        book(idx, result)


# --- room, spread and the whole pending set ----------------------------------------------------


def test_capacity_of_a_histogram_counts_whole_replicas_on_distinct_nodes() -> None:
    assert capacity_of({8: 2}, 1, 4) == 4  # two slots per node
    assert capacity_of({8: 2}, 2, 4) == 2  # each replica needs two nodes
    assert capacity_of({8: 1, 4: 1}, 2, 4) == 1  # the 8-GPU node alone cannot hold a pair
    assert capacity_of({8: 3}, 3, 8) == 1
    assert capacity_of({2: 5}, 1, 4) == 0
    assert capacity_of({}, 1, 1) == 0


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.integers(1, 8), st.integers(1, 4), max_size=4), profiles)
def test_capacity_of_matches_brute_force(
    hist: dict[int, int], wants: list[tuple[int, int]]
) -> None:
    frees = [v for v, c in hist.items() for _ in range(c)]
    for n, g in wants[:3]:
        # brute force: place replicas one at a time on the n nodes with the most room left
        left = sorted(frees, reverse=True)
        count = 0
        while True:
            order = sorted(range(len(left)), key=lambda i: -left[i])[:n]
            if len(order) < n or any(left[i] < g for i in order):
                break
            for i in order:
                left[i] -= g
            count += 1
        assert capacity_of(hist, n, g) == count


def test_the_room_left_for_pending_replicas_steers_a_placement() -> None:
    # a 1x6 and a 2x2 are pending on nodes of 6 and 8 GPUs: the 1x6 on the 6-GPU node (the
    # tightest fit) would leave no pair of nodes for the 2x2; on the 8-GPU node both fit
    idx = fleet(("six", "f", 6), ("eight", "f", 8))
    wide, pair = profile(nodes=1, gpus=6), profile(nodes=2, gpus=2)
    demand = Demand(idx, [Shape.of(pair)])
    got = idx.place(wide, {}, demand=demand)
    assert isinstance(got, Placement) and got.nodes == ("eight",)
    # without a pending pair, the tightest fit wins
    tight = idx.place(wide, {})
    assert isinstance(tight, Placement) and tight.nodes == ("six",)


def test_replicas_of_one_deployment_spread_across_nodes_within_a_fabric() -> None:
    idx = fleet(("n1", "f", 8), ("n2", "f", 8), ("n3", "f", 4))
    # n3 is the tightest fit, but a replica of the deployment is there already
    got = idx.place(profile(nodes=1, gpus=4), {}, per_node={NodeId("n3"): 1})
    assert isinstance(got, Placement) and got.nodes == ("n1",)


def test_an_unplaceable_reason_names_a_bounded_number_of_fabrics() -> None:
    idx = fleet(*((f"n{i:02d}", f"f{i:02d}", 2) for i in range(20)))
    got = idx.place(profile(nodes=1, gpus=4), {})
    assert isinstance(got, Unplaceable)
    assert got.reason.count(" has ") == REASON_FABRICS
    assert "14 more fabric(s) have fewer" in got.reason


@settings(max_examples=200, deadline=None)
@given(fleets, profiles, st.lists(st.integers(0, 3), min_size=3, max_size=3))
def test_the_ranked_answer_is_the_full_scan_answer(
    spec: list[tuple[str, int]], wants: list[tuple[int, int]], spread: list[int]
) -> None:
    """With room to spare, `place` answers from its per-shape ranking; it must choose exactly
    what a scan of every fabric chooses (an exclusion of an unknown node forces the scan)."""
    idx = CapacityIndex()
    for i, (fabric, gpus) in enumerate(spec):
        idx.add_node(node(f"n{i:02d}", fabric, gpus))
        idx.set_schedulable(NodeId(f"n{i:02d}"), True)
    per_fabric = {FabricId(f): c for f, c in zip(("fa", "fb", "fc"), spread, strict=True)}
    scan = frozenset({NodeId("not-a-node")})
    for n, g in wants:
        p = profile(nodes=n, gpus=g)
        fast, full = idx.place(p, per_fabric), idx.place(p, per_fabric, scan)
        assert fast == full
        if isinstance(fast, Placement):
            book(idx, fast)
