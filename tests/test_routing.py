"""The routing core on literal event streams and snapshots: only routable replicas, least
outstanding with deterministic ties, removal in the step that emits the leave, passive ejection
and its back-off, resync from a new controller, and the same-step removal on a real core."""

from __future__ import annotations

import pytest

from llmgw_twin.control.model import (
    ModelName,
    NodeId,
    ReplicaId,
    ShardState,
    TraceEvent,
)
from llmgw_twin.control.routing import Ejection, NoRoute, Route, Router
from llmgw_twin.control.routing_feed import SnapshotEntry, SnapshotState

M = ModelName("m")
R1, R2, R3 = ReplicaId("m-r1"), ReplicaId("m-r2"), ReplicaId("m-r3")


def ev(kind: str, rid: str, endpoint: str | None = None, model: str = "m") -> TraceEvent:
    return TraceEvent.of(0, kind, model=model, replica=rid, endpoint=endpoint)


def ready(router: Router, *rids: ReplicaId) -> None:
    for rid in rids:
        router.follow(ev("replica.ready", rid, f"http://{rid}:8000"))


def picked(router: Router, now: int = 0, exclude: tuple[ReplicaId, ...] = ()) -> str | None:
    p = router.pick(M, now, exclude)
    return None if p is None else p.replica


def ids(router: Router) -> list[str]:
    return [r.replica for r in router.routes(M)]


def test_only_replicas_the_controller_announced_routable_are_in_the_table() -> None:
    router = Router()
    router.follow(ev("replica.placed", R1, "http://x:1"))  # not a join
    router.follow(ev("replica.ready", R2))  # a join without an endpoint is no route
    assert ids(router) == []
    ready(router, R2, R1)
    assert ids(router) == [R1, R2]
    # a join that says the replica is not routable takes it out: adopted while not serving,
    # recovered while a node of it is suspect (no endpoint)
    not_serving = TraceEvent.of(0, "replica.adopted", model="m", replica=R1, ready=False)
    router.follow(not_serving)
    router.follow(ev("replica.recovered", R2))
    assert ids(router) == []
    ready(router, R2, R1)
    for leave, back in [
        ("replica.unroutable", "replica.routable"),
        ("replica.degraded", "replica.recovered"),
    ]:
        router.follow(ev(leave, R1))
        assert ids(router) == [R2]
        router.follow(ev(back, R1, "http://m-r1:8000"))
        assert ids(router) == [R1, R2]
    router.follow(ev("replica.failed", R1))
    router.follow(ev("replica.reaped", R2))
    assert ids(router) == [] and router.pick(M) is None
    assert router.why_none(M) is NoRoute.NO_REPLICA


def test_an_adopted_replica_joins_with_its_endpoint() -> None:
    router = Router()
    router.follow(ev("replica.adopted", R1, "http://a:8000"))
    assert router.routes(M) == [Route(R1, "http://a:8000")]


def test_the_pick_is_the_least_outstanding_replica() -> None:
    router = Router()
    ready(router, R1, R2, R3)
    picks = [router.pick(M) for _ in range(3)]
    assert [p.replica for p in picks if p] == [R1, R2, R3]  # each one request in flight
    router.finished(R2, ok=True)
    assert picked(router) == R2  # the only one with none
    assert router.outstanding(R2) == 1


def test_ties_go_to_the_least_recently_picked_then_a_new_replica_first() -> None:
    router = Router()
    ready(router, R1, R2)
    seen = []
    for _ in range(4):  # sequential requests: each finishes before the next
        p = router.pick(M)
        assert p is not None
        seen.append(p.replica)
        router.finished(p.replica, ok=True)
    assert seen == [R1, R2, R1, R2]
    ready(router, R3)  # a replacement joins: it is taken next, then the turn goes on
    p = router.pick(M)
    assert p is not None and p.replica == R3
    router.finished(R3, ok=True)
    assert picked(router) == R1


def test_two_routers_fed_the_same_events_pick_the_same() -> None:
    a, b = Router(), Router()
    for r in (a, b):
        ready(r, R3, R1, R2)
    for i in range(20):
        pa, pb = a.pick(M, i), b.pick(M, i)
        assert pa == pb
        if pa is not None and i % 3:
            a.finished(pa.replica, ok=i % 5 != 0, now_ms=i)
            b.finished(pa.replica, ok=i % 5 != 0, now_ms=i)


def test_exclude_keeps_a_retry_off_the_replica_that_failed() -> None:
    router = Router()
    ready(router, R1, R2)
    assert picked(router, exclude=(R1,)) == R2
    router.follow(ev("replica.failed", R2))
    assert router.pick(M, exclude=[R1]) is None
    assert router.why_none(M, exclude=[R1]) is NoRoute.NO_REPLICA


def fail(router: Router, rid: ReplicaId, times: int, now: int) -> list[bool]:
    out = []
    for _ in range(times):
        p = router.pick(M, now, exclude=[r for r in (R1, R2, R3) if r != rid])
        assert p is not None and p.replica == rid
        out.append(router.finished(rid, ok=False, now_ms=now))
    return out


def test_consecutive_failures_eject_a_replica_for_a_doubling_back_off() -> None:
    router = Router(Ejection(failures=3, base_ms=5_000, max_ms=12_000))
    ready(router, R1, R2)
    assert fail(router, R1, 3, now=1_000) == [False, False, True]
    assert router.ejected(1_000) == {R1: 6_000}
    assert ids(router) == [R1, R2]  # still in the controller's table: ejection is the router's
    for t in (1_000, 5_999):
        assert picked(router, t) == R2
        router.finished(R2, ok=True, now_ms=t)
    # back after the back-off, on probation: one failure ejects it again, for twice as long
    assert fail(router, R1, 1, now=6_000) == [True]
    assert router.ejected(6_000) == {R1: 16_000}
    assert fail(router, R1, 1, now=16_000) == [True]
    assert router.ejected(16_000) == {R1: 28_000}  # capped at max_ms
    # a success clears its record: it takes three failures again
    p = router.pick(M, 28_000, exclude=[R2])
    assert p is not None and not router.finished(R1, ok=True, now_ms=28_000)
    assert fail(router, R1, 3, now=29_000) == [False, False, True]
    assert router.ejected(29_000) == {R1: 34_000}
    assert router.ejections == 4


def test_a_success_between_failures_keeps_a_replica_in() -> None:
    router = Router(Ejection(failures=2))
    ready(router, R1)
    for ok in (False, True, False, True, False):
        assert router.pick(M, 0) is not None
        assert not router.finished(R1, ok=ok, now_ms=0)
    assert router.ejected(0) == {}


def test_every_replica_ejected_is_no_route_and_says_why() -> None:
    router = Router(Ejection(failures=1, base_ms=1_000, max_ms=1_000))
    ready(router, R1, R2)
    fail(router, R1, 1, now=0)
    fail(router, R2, 1, now=0)
    assert router.pick(M, 500) is None
    assert router.why_none(M, 500) is NoRoute.EJECTED
    assert router.pick(M, 1_000) is not None


def test_the_outstanding_limit_leaves_a_busy_replica_out() -> None:
    router = Router(outstanding_limit=2)
    ready(router, R1)
    assert router.pick(M) is not None and router.pick(M) is not None
    assert router.pick(M) is None and router.why_none(M) is NoRoute.BUSY
    router.finished(R1, ok=True)
    assert router.pick(M) is not None


def test_a_reaped_replica_with_requests_in_flight_is_accounted_until_they_end() -> None:
    router = Router()
    ready(router, R1)
    assert router.pick(M) is not None
    router.follow(ev("replica.reaped", R1))
    assert router.outstanding(R1) == 1
    assert not router.finished(R1, ok=False)
    assert router.outstanding(R1) == 0
    assert not router.finished(R1, ok=False)  # told twice: nothing to account for


def test_resync_keeps_adopting_replicas_it_had_and_drops_the_rest() -> None:
    router = Router()
    ready(router, R1, R2)
    router.follow(ev("replica.ready", "o-r1", "http://o:1", model="o"))
    router.resync(
        [
            SnapshotEntry(M, R1, SnapshotState.ADOPTING),  # kept, with the endpoint it had
            SnapshotEntry(M, R3, SnapshotState.READY, "http://m-r3:8000"),
            SnapshotEntry(M, ReplicaId("m-r9"), SnapshotState.ADOPTING),  # never had: not added
        ]
    )  # R2 and o-r1 are not in it: the new controller does not route them
    assert router.routes(M) == [Route(R1, "http://m-r1:8000"), Route(R3, "http://m-r3:8000")]
    assert router.models() == [M]


def test_ejection_settings_are_checked() -> None:
    with pytest.raises(ValueError):
        Ejection(failures=0)
    with pytest.raises(ValueError):
        Ejection(base_ms=10, max_ms=5)
    with pytest.raises(ValueError):
        Router(outstanding_limit=0)


def test_a_replica_leaves_the_table_in_the_step_its_node_is_lost_or_its_shard_exits() -> None:
    from test_fault_handling import Run

    run = Run([("n1", "ib-a"), ("n2", "ib-a")], replicas=2)
    run.up(1_000)
    assert len(run.router.routes(M)) == 2
    # a shard exits: the heartbeat's step fails the replica, and the router has dropped it
    step = run.beat("n2", 5_000, {0: ShardState.EXITED})
    assert "replica.failed" in [e.kind for e in step.events]
    assert [r.replica for r in run.router.routes(M)] == [
        r.id for r in run.ctl.ready_replicas(M) if r.nodes == (NodeId("n1"),)
    ]
    # n1 goes silent: out of routing in the step it turns suspect, and stays out once lost
    on_n1 = {r.id for r in run.ctl.live_replicas(M) if r.nodes == (NodeId("n1"),)}
    assert on_n1 and on_n1 <= {r.replica for r in run.router.routes(M)}
    t, suspect_seen = 6_000, False
    while "node.lost" not in run.events:
        assert t < 200_000
        if t % 10_000 == 0:
            run.beat("n2", t)
        step = run.tick(t)
        if "node.suspect" in [e.kind for e in step.events]:
            suspect_seen = True
        if suspect_seen:
            assert not on_n1 & {r.replica for r in run.router.routes(M)}
        t += 1_000
    assert suspect_seen
