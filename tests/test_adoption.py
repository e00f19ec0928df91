"""Adoption after a controller restart, on literal snapshots of the core (no SimPy).

A controller builds state, its writes go to a store, and a second controller starts from what
the store holds plus what agents report.
"""

from __future__ import annotations

from pathlib import Path

from conftest import FOUR, T, model, node, profile
from llmgw_twin.control.controller import Controller
from llmgw_twin.control.durable import DurableState
from llmgw_twin.control.model import (
    Deployment,
    NodeId,
    NodeState,
    ReplicaId,
    ReplicaState,
    ShardReport,
    ShardSpec,
    ShardState,
    TraceEvent,
)
from llmgw_twin.control.protocol import (
    ApplyDeployment,
    ApplyProfile,
    AssignShards,
    Heartbeat,
    NodeRegistered,
    RequestReport,
    Step,
)
from llmgw_twin.control.routing import Router
from llmgw_twin.control.routing_feed import snapshot_of
from llmgw_twin.store.sqlite import Store

M = model("llama")


def up(spec: ShardSpec) -> ShardReport:
    if spec.rank == 0:
        return ShardReport(spec, ShardState.SERVING, f"http://{spec.node}:8000", None, ("e",))
    return ShardReport(spec, ShardState.RUNNING, None, None, ("e",))


def running_fleet() -> tuple[Controller, DurableState]:
    """Two ready 2-node replicas, one per fabric; returns the controller and its store's state."""
    ctl = Controller(T)
    state = DurableState()

    def commit(step: Step) -> Step:
        nonlocal state
        state = state.apply(step.writes)
        return step

    commit(ctl.handle(ApplyProfile(profile("p")), 0))
    commit(ctl.handle(ApplyDeployment(Deployment(M, profile("p").name, 2)), 0))
    for name, fabric in FOUR:
        commit(ctl.handle(NodeRegistered(node(name, fabric)), 0))
    commit(ctl.tick(1_000))
    for n in ctl.nodes():
        commit(ctl.handle(Heartbeat(n, tuple(up(s) for s in ctl.assigned(n))), 20_000))
    commit(ctl.tick(21_000))
    assert len(ctl.ready_replicas(M)) == 2
    return ctl, state


def kinds(step: Step) -> list[str]:
    return [e.kind for e in step.events]


def report_from(ctl: Controller, old: Controller, name: str, t: int, skip_rank: int = -1) -> Step:
    n = NodeId(name)
    shards = tuple(up(s) for s in old.assigned(n) if s.rank != skip_rank)
    return ctl.handle(NodeRegistered(node(name, dict(FOUR)[name]), shards), t)


def test_the_store_holds_what_the_controller_placed() -> None:
    old, state = running_fleet()
    assert [r.id for r in state.replicas] == ["llama-r1", "llama-r2"]
    assert [r.specs for r in state.replicas] == [
        old.replica(ReplicaId("llama-r1")).specs,  # type: ignore[union-attr]
        old.replica(ReplicaId("llama-r2")).specs,  # type: ignore[union-attr]
    ]
    assert dict(state.seqs) == {"llama": 2}
    assert [n.node for n in state.nodes] == ["n1", "n2", "n3", "n4"]


def test_restart_asks_every_known_node_and_adopts_whole_replicas_without_restarting_them() -> None:
    old, state = running_fleet()
    ctl = Controller(T, restored=state)
    start = ctl.start(100_000)
    assert start.commands == tuple(RequestReport(NodeId(n)) for n, _ in FOUR)
    for name, _ in FOUR:
        step = report_from(ctl, old, name, 100_002)
        assert kinds(step) == []  # not a join, no shard.started: nothing was started
    tick = ctl.tick(101_000)
    assert kinds(tick) == ["replica.adopted", "replica.adopted", "controller.started"]
    assert tick.events[2].get("adopted") == 2 and tick.events[2].get("restored") == 2
    assert [r.endpoint for r in ctl.ready_replicas(M)] == ["http://n1:8000", "http://n3:8000"]
    # every node is told exactly what it already runs: nothing to start or stop
    for cmd in tick.commands:
        assert isinstance(cmd, AssignShards)
        assert cmd.shards == old.assigned(cmd.node)
    # nothing about any replica is written: only the controller's clock
    assert [type(w).__name__ for w in tick.writes] == ["PutClock"]


def test_a_replica_short_of_a_shard_is_failed_and_replaced_never_ready() -> None:
    old, state = running_fleet()
    ctl = Controller(T, restored=state)
    ctl.start(100_000)
    for name in ("n1", "n2", "n3"):
        report_from(ctl, old, name, 100_002)
    step = report_from(ctl, old, "n4", 100_002, skip_rank=1)  # n4 no longer runs rank 1
    assert kinds(step) == []
    tick = ctl.tick(101_000)
    assert kinds(tick)[:3] == ["replica.adopted", "replica.failed", "replica.reaped"]
    assert tick.events[1].get("reason") == "short of shard 1 on n4 after restart"
    assert ctl.replica(ReplicaId("llama-r2")).state is ReplicaState.REAPED  # type: ignore[union-attr]
    assert "replica.ready" not in kinds(tick)
    # n3's surviving leader is told to stop: its assignment no longer holds it
    assign = {c.node: c.shards for c in tick.commands if isinstance(c, AssignShards)}
    assert all(s.replica != "llama-r2" for s in assign[NodeId("n3")])


def test_a_replica_whose_leader_node_never_answers_waits_then_fails_without_an_endpoint() -> None:
    old, state = running_fleet()
    # restarted 5 s after the old controller's last tick: n1's silence is counted from then
    ctl = Controller(T, restored=state)
    ctl.start(26_000)
    for name in ("n2", "n3", "n4"):  # n1, the leader of llama-r1, is dead
        report_from(ctl, old, name, 26_002)
    tick = ctl.tick(27_000)
    assert kinds(tick) == ["replica.adopted", "controller.started"]
    r1 = ctl.replica(ReplicaId("llama-r1"))
    assert r1 is not None and r1.state is ReplicaState.ADOPTING and r1.endpoint is None
    assert [r.id for r in ctl.ready_replicas(M)] == ["llama-r2"]
    for t in range(28_000, 81_000, 1_000):
        for name in ("n2", "n3", "n4"):
            if t % 10_000 == 0:
                n = NodeId(name)
                ctl.handle(Heartbeat(n, tuple(up(s) for s in old.assigned(n))), t)
        assert "replica.ready" not in kinds(ctl.tick(t))
    # n1 was last heard at 20 s; the store's clock says a controller ran at 21 s: lost at 81 s,
    # 60 s after that, however the restart fell
    step = ctl.tick(81_000)
    assert kinds(step)[:3] == ["node.lost", "replica.failed", "replica.reaped"]
    assert step.events[1].get("replica") == "llama-r1"


def test_a_node_silent_through_a_long_outage_is_lost_at_the_first_reconcile() -> None:
    old, state = running_fleet()
    ctl = Controller(T, restored=state)
    ctl.start(100_000)  # down for 79 s: n1 (dead) has been silent since 21 s at least
    for name in ("n2", "n3", "n4"):
        report_from(ctl, old, name, 100_002)
    tick = ctl.tick(101_000)
    assert kinds(tick)[:5] == [
        "node.suspect",
        "replica.unroutable",  # out of routing the moment its node is silent, adopting or not
        "node.lost",
        "replica.failed",
        "replica.reaped",
    ]
    assert tick.events[2].get("node") == "n1"
    assert ctl.node_state(NodeId("n2")) is NodeState.ALIVE  # answered the report request


def test_unclaimed_shards_are_stopped_and_unknown_nodes_asked_to_register() -> None:
    old, state = running_fleet()
    ctl = Controller(T, restored=state)
    ctl.start(100_000)
    stray = ShardSpec(
        ReplicaId("gone-r7"),
        M,
        profile().name,
        profile().engine,
        "/m",
        0,
        1,
        NodeId("n1"),
        (5,),
        NodeId("n1"),
    )
    shards = (*tuple(up(s) for s in old.assigned(NodeId("n1"))), up(stray))
    ctl.handle(NodeRegistered(node("n1", "ib-a"), shards), 100_002)
    tick = ctl.tick(101_000)
    assign = {c.node: c.shards for c in tick.commands if isinstance(c, AssignShards)}
    assert assign[NodeId("n1")] == old.assigned(NodeId("n1"))  # the stray is not in it
    assert ctl.handle(Heartbeat(NodeId("n9"), ()), 101_500).commands == (
        RequestReport(NodeId("n9")),
    )


def test_restored_nodes_take_no_new_replica_until_heard_from() -> None:
    _, state = running_fleet()
    ctl = Controller(T, restored=state)
    ctl.start(100_000)
    ctl.handle(ApplyDeployment(Deployment(M, profile().name, 3)), 100_000)
    tick = ctl.tick(101_000)
    assert "replica.placed" not in kinds(tick)
    assert kinds(tick)[-1] == "replica.unplaceable"


def test_a_loading_replica_is_adopted_loading_and_becomes_ready_without_a_restart() -> None:
    old, state = running_fleet()
    ctl = Controller(T, restored=state)
    ctl.start(100_000)
    for name, _ in FOUR:
        n = NodeId(name)
        shards = tuple(
            ShardReport(s, ShardState.STARTING, None, None, ("e",)) for s in old.assigned(n)
        )
        ctl.handle(NodeRegistered(node(name, dict(FOUR)[name]), shards), 100_002)
    tick = ctl.tick(101_000)
    assert [e.get("ready") for e in tick.events if e.kind == "replica.adopted"] == [False, False]
    assert ctl.ready_replicas(M) == []
    for name, _ in FOUR:
        report_from(ctl, old, name, 110_000)
    assert kinds(ctl.tick(111_000)) == ["replica.ready", "replica.ready"]


def test_a_restart_from_the_store_file_restores_every_placed_replica(tmp_path: Path) -> None:
    path = str(tmp_path / "ctl.db")
    expected = DurableState()
    ctl = Controller(T)
    with Store(path) as store:
        for step in (
            ctl.handle(ApplyProfile(profile("p")), 0),
            ctl.handle(ApplyDeployment(Deployment(M, profile("p").name, 2)), 0),
            *(ctl.handle(NodeRegistered(node(n, f)), 0) for n, f in FOUR),
            ctl.tick(1_000),
        ):
            store.commit(step.writes)
            expected = expected.apply(step.writes)
    with Store(path) as store:
        loaded = store.load()
    assert loaded == expected
    again = Controller(T, restored=loaded)
    again.start(5_000)
    restored = again.replicas()
    assert [(r.id, r.state, r.specs) for r in restored] == [
        (r.id, ReplicaState.ADOPTING, r.specs) for r in ctl.replicas()
    ]


def test_a_replica_whose_shards_are_still_preparing_is_adopted_not_failed() -> None:
    old, state = running_fleet()
    ctl = Controller(T, restored=state)
    ctl.start(100_000)
    for name, _ in FOUR:
        n = NodeId(name)
        shards = tuple(ShardReport(s, ShardState.PREPARING) for s in old.assigned(n))
        ctl.handle(NodeRegistered(node(name, dict(FOUR)[name]), shards), 100_002)
    tick = ctl.tick(101_000)
    assert kinds(tick) == ["replica.adopted", "replica.adopted", "controller.started"]
    assert "replica.failed" not in kinds(tick)


def test_an_unheard_replica_is_out_of_routing_but_kept_until_its_node_is_lost() -> None:
    """As a controller that never restarted treats a replica on a suspect node: out of routing
    (the routers told, whatever its state: adopting here), still counted, not replaced, and
    adopted as it was when the node answers before it is declared lost."""
    old, state = running_fleet()
    router = Router()  # a router beside the controllers, which routed both before the restart
    for rec in old.ready_replicas(M):
        router.follow(TraceEvent.of(0, "replica.ready", model=M, replica=rec.id, endpoint="e"))
    ctl = Controller(T, restored=state)
    ctl.start(26_000)  # n1's silence counts from 21 s, the old controller's last clock
    router.resync(snapshot_of(ctl.replicas()))  # both restored, not judged: both kept
    for name in ("n2", "n3", "n4"):
        report_from(ctl, old, name, 26_002)
    ctl.tick(27_000)
    r1 = ReplicaId("llama-r1")
    assert [r.replica for r in router.routes(M)] == ["llama-r1", "llama-r2"]
    unroutable: list[object] = []
    for t in range(28_000, 60_000, 1_000):
        if t % 10_000 == 0:
            for name in ("n2", "n3", "n4"):
                n = NodeId(name)
                ctl.handle(Heartbeat(n, tuple(up(s) for s in old.assigned(n))), t)
        step = ctl.tick(t)
        for ev in step.events:
            router.follow(ev)
        unroutable += [e.get("replica") for e in step.events if e.kind == "replica.unroutable"]
        assert "replica.placed" not in kinds(step), t  # no replacement while n1 is not lost
    assert ctl.node_state(NodeId("n1")) is NodeState.SUSPECT
    assert unroutable == ["llama-r1"]
    assert [r.replica for r in router.routes(M)] == ["llama-r2"]
    assert ctl.replica(r1).state is ReplicaState.ADOPTING  # type: ignore[union-attr]
    assert [r.id for r in ctl.live_replicas(M)] == ["llama-r1", "llama-r2"]
    assert ctl.pending_ids() == []
    # a router that resyncs now is not given it either
    assert [e.replica for e in snapshot_of(ctl.replicas())] == ["llama-r2"]
    report_from(ctl, old, "n1", 60_002)
    tick = ctl.tick(61_000)
    assert kinds(tick)[:1] == ["replica.adopted"]
    assert tick.events[0].get("endpoint") == "http://n1:8000"
    assert [r.id for r in ctl.ready_replicas(M)] == ["llama-r1", "llama-r2"]


def test_the_first_judgement_waits_for_answers_to_requests_delivered_late() -> None:
    """The shell queues the start's report requests and says when they were delivered: until
    every node asked has answered, or an interval has passed since then, nothing is judged."""
    old, state = running_fleet()
    ctl = Controller(T, restored=state)
    start = ctl.start(200_000, awaits_delivery=True)  # an outage far past the lost window
    assert start.wake_at_ms == 201_000
    report_from(ctl, old, "n1", 200_500)
    for t in (201_000, 202_000, 203_000):  # n2..n4 not asked yet: their requests queue
        tick = ctl.tick(t)
        assert kinds(tick) == [] and tick.writes == (), t
        assert tick.wake_at_ms == t + 1_000
    assert ctl.awaiting_answers() == [NodeId("n2"), NodeId("n3"), NodeId("n4")]
    ctl.report_delivered(NodeId("n1"), 200_400)  # n1 answered: its delivery no longer matters
    for name in ("n2", "n3", "n4"):  # delivered, or the send to n4 failed
        ctl.report_delivered(NodeId(name), 203_500)
    report_from(ctl, old, "n2", 203_600)
    report_from(ctl, old, "n3", 203_700)  # n4 died during the outage: never answers
    assert kinds(ctl.tick(204_000)) == []
    tick = ctl.tick(204_500)  # an interval after the delivery: judged, off the reconcile grid
    assert "node.lost" in kinds(tick) and "controller.started" in kinds(tick)
    lost = [e.get("node") for e in tick.events if e.kind == "node.lost"]
    assert lost == ["n4"]
    assert tick.wake_at_ms == 205_000  # the reconciles keep the start's phase


def test_the_first_judgement_comes_once_every_node_asked_answered() -> None:
    old, state = running_fleet()
    ctl = Controller(T, restored=state)
    ctl.start(200_000, awaits_delivery=True)
    assert kinds(ctl.tick(201_000)) == []  # nothing delivered, nobody answered
    for name, _ in FOUR:
        report_from(ctl, old, name, 201_500)
    tick = ctl.tick(202_000)
    assert kinds(tick) == ["replica.adopted", "replica.adopted", "controller.started"]
