"""The scale-down order in O(n log n) retires exactly the replicas, in the order, that the rule
judged anew after each retirement (a minimum over the rest, as the controller did) retires."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw_twin.control.model import FabricId, ReplicaState
from llmgw_twin.control.surplus import retire_order


@dataclass
class Rep:
    seq: int
    fabric: FabricId | None
    static: tuple[bool, ...]
    state: ReplicaState = ReplicaState.READY


def _reap(rep: Rep, per_fabric: dict[FabricId, int]) -> None:
    rep.state = ReplicaState.REAPED
    if rep.fabric is not None:
        per_fabric[rep.fabric] -= 1


def _by_minimum(reps: list[Rep], per_fabric: dict[FabricId, int], n: int) -> list[int]:
    """The rule as written: the minimum over the rest, judged after each retirement."""
    left, out = list(reps), []
    for _ in range(n):
        victim = min(
            left,
            key=lambda r: (
                *r.static,
                -per_fabric.get(r.fabric, 0) if r.fabric is not None else 0,
                -r.seq,
            ),
        )
        _reap(victim, per_fabric)
        left.remove(victim)
        out.append(victim.seq)
    return out


def _by_order(reps: list[Rep], per_fabric: dict[FabricId, int], n: int) -> list[int]:
    out = []
    for victim in itertools.islice(retire_order(reps, lambda r: r.static, per_fabric), n):
        _reap(victim, per_fabric)
        out.append(victim.seq)
    return out


def _fleet(draw: st.DrawFn) -> tuple[list[Rep], dict[FabricId, int], int]:
    size = draw(st.integers(1, 40))
    fabrics = [FabricId(f"ib-{c}") for c in "abcd"]
    reps = []
    for seq in draw(st.permutations(range(1, size + 1))):
        placed = draw(st.booleans())
        fabric = draw(st.sampled_from(fabrics)) if placed else None
        static = tuple(draw(st.lists(st.booleans(), min_size=2, max_size=2)))
        reps.append(Rep(seq, fabric, (not placed, *static)))
    per_fabric: dict[FabricId, int] = {}
    for r in reps:
        if r.fabric is not None:
            per_fabric[r.fabric] = per_fabric.get(r.fabric, 0) + 1
    # replicas of the model not counted (copies in flight, say) still count in their fabric
    for f in fabrics:
        per_fabric[f] = per_fabric.get(f, 0) + draw(st.integers(0, 3))
    return reps, per_fabric, draw(st.integers(0, size))


fleets = st.composite(_fleet)


@settings(max_examples=300, deadline=None)
@given(fleets())
def test_the_order_retires_what_the_minimum_rule_retires(
    fleet: tuple[list[Rep], dict[FabricId, int], int],
) -> None:
    reps, per_fabric, n = fleet
    twin = [Rep(r.seq, r.fabric, r.static) for r in reps]
    expected = _by_minimum(twin, dict(per_fabric), n)
    assert _by_order(reps, dict(per_fabric), n) == expected


def test_a_copy_reaped_with_an_original_is_skipped_and_its_fabric_counted_down() -> None:
    a1, a2, b1 = (
        Rep(1, FabricId("ib-a"), ()),
        Rep(2, FabricId("ib-a"), ()),
        Rep(3, FabricId("ib-b"), ()),
    )
    per_fabric = {FabricId("ib-a"): 3, FabricId("ib-b"): 1}
    order = retire_order([a1, a2, b1], lambda r: r.static, per_fabric)
    first = next(order)
    assert first is a2  # ib-a holds the most, a2 is its newest
    _reap(a2, per_fabric)
    _reap(a1, per_fabric)  # reaped with it (a move's other half, say)
    per_fabric[FabricId("ib-a")] -= 1  # and a copy of ib-a not among the counted
    assert list(order) == [b1]
