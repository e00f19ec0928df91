"""Defragmentation on literal snapshots of the controller core: the plan, make-before-break,
aborted moves, the rate limit and the off switch."""

from __future__ import annotations

from dataclasses import replace

from conftest import T, model, node, profile
from llmgw_twin.control.controller import Controller
from llmgw_twin.control.defrag_plan import Movable, plan_moves
from llmgw_twin.control.model import (
    Deployment,
    FabricId,
    ModelName,
    NodeId,
    Profile,
    ProfileName,
    ReplicaId,
    ReplicaState,
    ShardReport,
    ShardSpec,
    ShardState,
    Timings,
    TraceEvent,
)
from llmgw_twin.control.placement import CapacityIndex
from llmgw_twin.control.protocol import (
    ApplyDeployment,
    ApplyProfile,
    Heartbeat,
    NodeRegistered,
    Step,
)

CHAT, BIG = model("chat"), model("big")


def kinds(step: Step) -> list[str]:
    return [e.kind for e in step.events]


def report(spec: ShardSpec, state: ShardState) -> ShardReport:
    endpoint = f"http://{spec.node}:{8000 + spec.gpus[0]}" if state is ShardState.SERVING else None
    return ShardReport(spec, state, endpoint, None, ("engine", str(spec.rank)))


def heartbeat_all(
    ctl: Controller, now: int, exited: frozenset[ReplicaId] = frozenset()
) -> list[TraceEvent]:
    """Every node reports its assigned shards up (or exited, for `exited` replicas); the events
    those reports caused."""
    events: list[TraceEvent] = []
    for n in ctl.nodes():
        shards = tuple(
            report(
                s,
                ShardState.EXITED
                if s.replica in exited
                else (ShardState.SERVING if s.rank == 0 else ShardState.RUNNING),
            )
            for s in ctl.assigned(n)
        )
        events += ctl.handle(Heartbeat(n, shards), now).events
    return events


def fleet(timings: Timings = T, chat: int = 3) -> Controller:
    """ib-a: n1, n2, n3; ib-b: n4 (8 GPUs each); `chat` replicas of 1x4 ready, spread over
    nodes and fabrics (n1, n2 and n4); a 2x8 deployment wanted at none yet."""
    ctl = Controller(timings)
    ctl.handle(ApplyProfile(profile("chat-1n", nodes=1, gpus=4)), 0)
    ctl.handle(ApplyProfile(profile("big-2n", nodes=2, gpus=8)), 0)
    ctl.handle(ApplyDeployment(Deployment(CHAT, ProfileName("chat-1n"), chat)), 0)
    ctl.handle(ApplyDeployment(Deployment(BIG, ProfileName("big-2n"), 0)), 0)
    for name, fabric in (("n1", "ib-a"), ("n2", "ib-a"), ("n3", "ib-a"), ("n4", "ib-b")):
        ctl.handle(NodeRegistered(node(name, fabric)), 0)
    ctl.tick(1_000)
    heartbeat_all(ctl, 2_000)
    ctl.tick(3_000)
    assert len(ctl.ready_replicas(CHAT)) == chat
    return ctl


def want_big(ctl: Controller, now: int) -> Step:
    ctl.handle(ApplyDeployment(Deployment(BIG, ProfileName("big-2n"), 1)), now)
    return ctl.tick(now)


def test_a_move_is_make_before_break_and_makes_room_in_its_own_fabric() -> None:
    ctl = fleet()
    where = {r.id: r.nodes for r in ctl.ready_replicas(CHAT)}
    assert sorted(where.values()) == [("n1",), ("n2",), ("n4",)]
    step = want_big(ctl, 10_000)
    assert kinds(step) == ["replica.unplaceable", "replica.moving", "replica.placed"]
    moving = step.events[1]
    original = moving.get("replica")
    copy = ReplicaId(str(moving.get("to")))
    assert moving.get("fabric") == "ib-a" and where[ReplicaId(str(original))] != ("n4",)
    assert "room for big-r1" in str(moving.get("reason"))
    assert ctl.moves() == {copy: original}
    # the copy loads; the original still serves, and the deployment wants no more
    ctl.tick(11_000)
    assert len(ctl.ready_replicas(CHAT)) == 3
    assert ctl.replica(ReplicaId(str(original))).state is ReplicaState.READY  # type: ignore[union-attr]
    heartbeat_all(ctl, 12_000)
    step = ctl.tick(13_000)
    assert kinds(step) == [
        "replica.ready",
        "replica.moved",
        "replica.reaped",
        "replica.placed",
    ]
    assert step.events[0].get("replica") == copy
    assert step.events[2].get("replica") == original
    assert step.events[3].get("model") == "big" and step.events[3].get("fabric") == "ib-a"
    assert len(ctl.ready_replicas(CHAT)) == 3 and ctl.moves() == {}
    assert {r.fabric for r in ctl.live_replicas(CHAT)} == {"ib-a", "ib-b"}


def test_a_copy_that_fails_aborts_its_move_and_the_original_stays() -> None:
    ctl = fleet()
    step = want_big(ctl, 10_000)
    copy = ReplicaId(str(step.events[1].get("to")))
    original = ReplicaId(str(step.events[1].get("replica")))
    events = heartbeat_all(ctl, 12_000, exited=frozenset({copy}))
    assert "replica.move_aborted" in [e.kind for e in events]
    ctl.tick(13_000)
    assert ctl.replica(original).state is ReplicaState.READY  # type: ignore[union-attr]
    assert ctl.moves() == {}
    assert len(ctl.ready_replicas(CHAT)) == 3
    assert [r.state for r in ctl.live_replicas(BIG)] == [ReplicaState.PENDING]


def test_an_original_that_fails_first_leaves_its_copy_as_its_replacement() -> None:
    ctl = fleet()
    step = want_big(ctl, 10_000)
    copy = ReplicaId(str(step.events[1].get("to")))
    original = ReplicaId(str(step.events[1].get("replica")))
    events = heartbeat_all(ctl, 11_000, exited=frozenset({original}))
    ctl.tick(11_000)
    aborted = [e for e in events if e.kind == "replica.move_aborted"]
    assert aborted and f"{copy} replaces it" in str(aborted[0].get("reason"))
    # the copy counts now: no further replacement was created
    assert sorted(r.id for r in ctl.live_replicas(CHAT) if not r.placed) == []
    assert copy in {r.id for r in ctl.live_replicas(CHAT)}
    assert len(ctl.live_replicas(CHAT)) == 3


def test_an_original_scaled_down_takes_its_copy_with_it() -> None:
    ctl = fleet()
    step = want_big(ctl, 10_000)
    copy = ReplicaId(str(step.events[1].get("to")))
    original = ReplicaId(str(step.events[1].get("replica")))
    ctl.handle(ApplyDeployment(Deployment(CHAT, ProfileName("chat-1n"), 0)), 11_000)
    ctl.tick(11_000)
    assert ctl.live_replicas(CHAT) == []
    assert ctl.replica(copy).state is ReplicaState.REAPED  # type: ignore[union-attr]
    assert ctl.replica(original).state is ReplicaState.REAPED  # type: ignore[union-attr]
    assert ctl.moves() == {}


def test_defragmentation_is_off_at_zero_moves() -> None:
    ctl = fleet(replace(T, defrag_max_moves=0))
    step = want_big(ctl, 10_000)
    assert kinds(step) == ["replica.unplaceable"]
    for t in range(11_000, 200_000, 1_000):
        heartbeat_all(ctl, t)
        assert "replica.moving" not in kinds(ctl.tick(t))


def test_a_second_defragmentation_waits_for_the_interval() -> None:
    ctl = fleet(replace(T, defrag_interval_ms=120_000))
    step = want_big(ctl, 10_000)
    copy = ReplicaId(str(step.events[1].get("to")))
    events = heartbeat_all(ctl, 12_000, exited=frozenset({copy}))
    assert "replica.move_aborted" in [e.kind for e in events]
    started = []
    for t in range(14_000, 200_000, 1_000):
        heartbeat_all(ctl, t)
        if "replica.moving" in kinds(ctl.tick(t)):
            started.append(t)
            break
    assert started == [10_000 + 120_000]


def _index(*nodes: tuple[str, str]) -> CapacityIndex:
    idx = CapacityIndex()
    for name, fabric in nodes:
        idx.add_node(node(name, fabric))
        idx.set_schedulable(NodeId(name), True)
    return idx


def _running(idx: CapacityIndex, **where: str) -> list[Movable]:
    """A 1x4 replica named by each key, on the first four GPUs of the node it names."""
    out = []
    for rid, n in where.items():
        gpus = idx.free_gpus(NodeId(n))[:4]
        idx.book(NodeId(n), gpus)
        fabric = FabricId("ib-a" if n.startswith("a") else "ib-b")
        small = profile("small", nodes=1, gpus=4)
        out.append(Movable(ReplicaId(rid), small, fabric, ((NodeId(n), gpus),), frozenset()))
    return out


def test_the_plan_moves_within_a_fabric_before_it_moves_across() -> None:
    wide = profile("wide", nodes=2, gpus=8)
    order = [FabricId("ib-a"), FabricId("ib-b")]
    idx = _index(("a1", "ib-a"), ("a2", "ib-a"), ("a3", "ib-a"), ("b1", "ib-b"))
    movable = _running(idx, s1="a1", s2="a2")
    plan = plan_moves(idx, wide, frozenset(), movable, 4, order, across=2)
    assert plan is not None and len(plan.moves) == 1  # one small joins the other
    assert plan.moves[0].to.fabric == "ib-a"  # b1 has room too, but the fabric comes first
    assert plan.target.fabric == "ib-a" and len(set(plan.target.nodes) & {"a3"}) == 1


def test_the_plan_moves_across_fabrics_only_when_allowed_and_needed() -> None:
    wide = profile("wide", nodes=2, gpus=8)
    order = [FabricId("ib-a"), FabricId("ib-b")]
    idx = _index(("a1", "ib-a"), ("a2", "ib-a"), ("b1", "ib-b"))
    movable = _running(idx, s1="a1", s2="a2")  # ib-a holds the wide one only if both leave
    assert plan_moves(idx, wide, frozenset(), movable, 4, order, across=0) is None
    assert plan_moves(idx, wide, frozenset(), movable, 4, order, across=1) is None
    plan = plan_moves(idx, wide, frozenset(), movable, 4, order, across=2)
    assert plan is not None and sorted(m.to.fabric for m in plan.moves) == ["ib-b", "ib-b"]
    assert plan.target.nodes == ("a1", "a2")
    # and never more moves than allowed
    assert plan_moves(idx, wide, frozenset(), movable, 1, order, across=2) is None


def test_a_copy_goes_where_no_other_replica_of_its_deployment_runs() -> None:
    # chat's s1 on a1 and s2 on a2, another model's 1x4 on a3: a 1x8 needs one of a1 and a2
    # emptied, and the copy fits on the other one or on a3 alike (4 GPUs free on each)
    def plan_with(deployment: dict[NodeId, int]) -> tuple[str, ...]:
        idx = _index(("a1", "ib-a"), ("a2", "ib-a"), ("a3", "ib-a"))
        idx.book(NodeId("a3"), idx.free_gpus(NodeId("a3"))[:4])
        movable = [replace(m, deployment=deployment) for m in _running(idx, s1="a1", s2="a2")]
        whole = profile("whole", nodes=1, gpus=8)
        plan = plan_moves(idx, whole, frozenset(), movable, 1, [FabricId("ib-a")])
        assert plan is not None and len(plan.moves) == 1
        return plan.moves[0].to.nodes

    chat = {NodeId("a1"): 1, NodeId("a2"): 1}
    assert plan_with(chat) == ("a3",)  # not beside its deployment's other replica
    assert plan_with({}) != ("a3",)  # with nothing to spread from, the name decides


def test_a_plan_in_stages_puts_a_later_copy_where_an_earlier_original_was() -> None:
    # a0 and a2 (4 GPUs) hold a 1x2 each, a1 (8 GPUs) a 1x4: a 1x8 needs a1. The 1x4 fits
    # nowhere now; once one 1x2 has joined the other, it fits where that one was
    idx = CapacityIndex()
    for name, size in (("a0", 4), ("a1", 8), ("a2", 4)):
        idx.add_node(node(name, "ib-a", size))
        idx.set_schedulable(NodeId(name), True)
    placed = {"s0": ("a0", 2), "s1": ("a2", 2), "s2": ("a1", 4)}
    movable = []
    for rid, (n, k) in placed.items():
        taken = idx.free_gpus(NodeId(n))[:k]
        idx.book(NodeId(n), taken)
        p = profile(f"p{k}", nodes=1, gpus=k)
        held = ((NodeId(n), taken),)
        movable.append(Movable(ReplicaId(rid), p, FabricId("ib-a"), held, frozenset()))
    whole = profile("whole", nodes=1, gpus=8)
    plan = plan_moves(idx, whole, frozenset(), movable, 4, [FabricId("ib-a")])
    assert plan is not None and plan.stages == 2
    assert plan.target.nodes == ("a1",)
    assert len(plan.moves) == 1 and plan.moves[0].replica in ("s0", "s1")
    assert plan.moves[0].to.nodes == (("a2",) if plan.moves[0].replica == "s0" else ("a0",))
    # one move is not enough
    assert plan_moves(idx, whole, frozenset(), movable, 1, [FabricId("ib-a")]) is None


def sim2_fleet(name: ModelName, p: Profile, replicas: int) -> Controller:
    """n1 and n2 (ib-a) run `sim` and `sim2`; `replicas` of `p` (a sim2 profile) are ready
    there; then m1 and m2 (ib-b) join, running sim2 only: room for those replicas' copies and
    for nothing else."""
    ctl = Controller(T)
    ctl.handle(ApplyProfile(p), 0)
    ctl.handle(ApplyDeployment(Deployment(name, p.name, replicas)), 0)
    for n in ("n1", "n2"):
        ctl.handle(NodeRegistered(node(n, "ib-a", engines=("sim", "sim2"))), 0)
    ctl.tick(1_000)
    heartbeat_all(ctl, 2_000)
    ctl.tick(3_000)
    for n in ("m1", "m2"):
        ctl.handle(NodeRegistered(node(n, "ib-b", engines=("sim2",))), 4_000)
    return ctl


def test_a_move_waits_for_its_copy_to_be_routable_before_the_original_stops() -> None:
    """A 2-node copy becomes whole from a worker's last report while that worker's node has
    fallen silent: stopping the original then would trade a serving replica for none."""
    x = model("x")
    ctl = sim2_fleet(x, profile("x2", nodes=2, gpus=4, engine="sim2"), 1)
    original = ctl.ready_replicas(x)[0].id
    ctl.handle(ApplyProfile(profile("whole", nodes=1, gpus=8)), 5_000)
    ctl.handle(ApplyDeployment(Deployment(model("whole"), ProfileName("whole"), 1)), 5_000)
    step = ctl.tick(5_000)
    assert "replica.moving" in kinds(step)
    copy = next(iter(ctl.moves()))

    def beat(n: str, t: int, up: bool) -> None:
        shards = tuple(
            report(
                s,
                (ShardState.SERVING if s.rank == 0 else ShardState.RUNNING)
                if up
                else ShardState.STARTING,
            )
            for s in ctl.assigned(NodeId(n))
        )
        ctl.handle(Heartbeat(NodeId(n), shards), t)

    leader, worker = (s.node for s in ctl.replica(copy).specs)  # type: ignore[union-attr]
    seen: list[str] = []
    for t in range(6_000, 200_000, 1_000):
        for n in ("n1", "n2"):
            beat(n, t, True)
        if t <= 8_000:
            beat(worker, t, True)  # the worker is up, then its node goes silent
        beat(leader, t, t >= 45_000)  # the leader serves only once the worker is suspect
        seen += [e.kind for e in ctl.tick(t).events]
        if ctl.replica(copy).state is ReplicaState.READY:  # type: ignore[union-attr]
            assert ctl.replica(original).state is ReplicaState.READY  # type: ignore[union-attr]
    assert "replica.moved" not in seen
    # the copy's silent node was lost: the move was aborted and x still serves from the original
    assert "replica.move_aborted" in seen
    assert [r.id for r in ctl.ready_replicas(x)] == [original]


def test_a_replica_laid_out_under_an_edited_profile_is_not_moved() -> None:
    """Restored under a profile edited since it was placed, a replica keeps its old layout; a
    copy laid out anew would be another shape, and one that never becomes whole."""
    ctl = sim2_fleet(CHAT, profile("chat", nodes=1, gpus=4, engine="sim2"), 2)
    for rec in ctl.ready_replicas(CHAT):  # as a restore under the edited profile leaves them
        rec.profile = profile("chat", nodes=2, gpus=4, engine="sim2")
        rec.layout_shards = 1
    ctl.handle(ApplyProfile(profile("whole", nodes=1, gpus=8)), 5_000)
    ctl.handle(ApplyDeployment(Deployment(model("whole"), ProfileName("whole"), 1)), 5_000)
    assert kinds(ctl.tick(5_000)) == ["replica.unplaceable"]
    assert ctl.moves() == {}


def test_the_room_a_move_makes_is_held_for_its_target() -> None:
    """While the moves run, a replica deployed after them does not take the free GPUs the
    target is to use; when the moves are done the target is placed in that step."""
    ctl = fleet()
    step = want_big(ctl, 10_000)
    target = next(e for e in step.events if e.kind == "replica.moving").get("reason")
    assert "on n1, n3 in ib-a" in str(target)  # n3 is free now, n1 once chat leaves it
    ctl.handle(ApplyProfile(profile("wide", nodes=1, gpus=8)), 11_000)
    ctl.handle(ApplyDeployment(Deployment(model("wide"), ProfileName("wide"), 1)), 11_000)
    step = ctl.tick(11_000)
    assert "replica.placed" not in kinds(step)  # n3 is held: nothing else fits
    heartbeat_all(ctl, 12_000)
    step = ctl.tick(13_000)
    placed = [e for e in step.events if e.kind == "replica.placed"]
    assert [(e.get("model"), e.get("nodes")) for e in placed] == [("big", ("n1", "n3"))]
    # and once the move is over, nothing stays held: the capacity is all accounted for
    held = {n: ctl.booked_gpus(NodeId(n)) for n in ("n1", "n3")}
    assert held == {"n1": tuple(range(8)), "n3": tuple(range(8))}
