"""The pace of disruption (`control/pace.py`) and the mass-loss hold's bound (`control/guard.py`):
the budget itself, silent nodes declared lost at the pace and the rest kept, a hold that ends in
an accepted loss, a hold and a pace that survive a restart, and drains within the budget. Each
test fails without its behaviour."""

from __future__ import annotations

from dataclasses import replace

from conftest import T, model, node, profile
from llmgw_twin.control.controller import Controller
from llmgw_twin.control.durable import DurableState
from llmgw_twin.control.model import (
    Deployment,
    FabricId,
    NodeId,
    NodeState,
    ShardReport,
    ShardState,
    Timings,
)
from llmgw_twin.control.pace import EvictionPace
from llmgw_twin.control.protocol import (
    ApplyDeployment,
    ApplyProfile,
    Drain,
    Heartbeat,
    NodeRegistered,
    Step,
)
from llmgw_twin.control.routing import Router

M = model("m")
A, B, C = FabricId("ib-a"), FabricId("ib-b"), FabricId("ib-c")


class Run:
    """A controller, its store as data, and a router fed by its events (one 8-GPU replica per
    node unless told otherwise)."""

    def __init__(
        self,
        nodes: list[tuple[str, str]],
        replicas: int,
        timings: Timings,
        gpus: int = 8,
        restored: DurableState | None = None,
    ) -> None:
        self.ctl = Controller(timings, restored)
        self.state = restored or DurableState()
        self.router = Router()
        self.events: list[tuple[int, str, object]] = []
        self.nodes = nodes
        if restored is None:
            p = profile("p", nodes=1, gpus=gpus)
            self.apply(self.ctl.handle(ApplyProfile(p), 0))
            self.apply(self.ctl.handle(ApplyDeployment(Deployment(M, p.name, replicas)), 0))
            for name, fabric in nodes:
                self.apply(self.ctl.handle(NodeRegistered(node(name, fabric)), 0))

    def apply(self, step: Step) -> Step:
        self.state = self.state.apply(step.writes)
        for ev in step.events:
            self.router.follow(ev)
            self.events.append((ev.t_ms, ev.kind, ev.get("node")))
        return step

    def tick(self, t: int) -> Step:
        return self.apply(self.ctl.tick(t))

    def beat(self, name: str, t: int) -> Step:
        n = NodeId(name)
        reports = [
            ShardReport(s, ShardState.SERVING, f"http://{s.node}:{8000 + s.gpus[0]}")
            for s in self.ctl.assigned(n)
        ]
        return self.apply(self.ctl.handle(Heartbeat(n, tuple(reports)), t))

    def up(self, t: int) -> None:
        self.tick(t)
        for name, _ in self.nodes:
            self.beat(name, t + 10)
        self.tick(t + 1_000)

    def run(self, start: int, end: int, heard: list[str]) -> None:
        """Reconcile every second from `start` to `end` (exclusive), the `heard` nodes beating
        every ten."""
        for t in range(start, end, 1_000):
            if t % 10_000 == 0:
                for name in heard:
                    self.beat(name, t)
            self.tick(t)

    def of(self, kind: str) -> list[object]:
        return [n for _, k, n in self.events if k == kind]


TWELVE = [(f"n{i:02d}", ("ib-a", "ib-b", "ib-c")[(i - 1) // 4]) for i in range(1, 13)]
EIGHT = [(f"n{i}", "ib-a" if i <= 4 else "ib-b") for i in range(1, 9)]


# --- the budget ---------------------------------------------------------------------------------


def test_the_budget_holds_per_fleet_and_per_fabric_over_a_sliding_window() -> None:
    pace = EvictionPace(replace(T, eviction_budget=4, eviction_fabric_budget=2))
    assert pace.take({A: 2}, 0)
    assert not pace.fits({A: 1}, 1_000)  # the fabric's budget is spent
    assert pace.take({B: 2}, 1_000)
    assert not pace.fits({C: 1}, 2_000)  # the fleet's budget is spent
    assert pace.spent(59_999) == 4
    assert pace.take({A: 2}, 60_000)  # the first spend left the window
    assert not pace.fits({B: 1}, 60_000)
    assert pace.fits({B: 1}, 61_000)
    assert pace.fits({}, 61_000) and pace.fits({C: 0}, 0)  # nothing taken down costs nothing


def test_an_oversized_cost_goes_alone_and_zero_switches_the_limit_off() -> None:
    pace = EvictionPace(replace(T, eviction_budget=4, eviction_fabric_budget=2))
    assert pace.take({A: 6}, 0)  # more than either budget: alone in its window
    assert not pace.fits({B: 1}, 59_999)
    assert pace.fits({B: 1}, 60_000)
    off = EvictionPace(replace(T, eviction_budget=0, eviction_fabric_budget=0))
    assert all(off.take({A: 100}, t) for t in range(0, 5_000, 1_000))


# --- silent nodes at the pace -------------------------------------------------------------------


def test_silent_nodes_beyond_the_budget_are_kept_out_of_routing_and_not_replaced() -> None:
    timings = replace(T, eviction_budget=2, eviction_fabric_budget=1)
    run = Run(TWELVE, replicas=12, timings=timings)
    run.up(1_000)
    assert len(run.ctl.ready_replicas(M)) == 12
    silent = ["n01", "n02", "n03", "n05", "n06"]  # 5 of 12: under the mass-loss share
    heard = [n for n, _ in TWELVE if n not in silent]
    run.run(2_000, 80_000, heard)
    assert not run.ctl.held()
    # one node per fabric (the fabric budget), two in all (the fleet budget); the rest paced
    lost = run.of("node.lost")
    fabrics = {info.fabric for n in lost if (info := run.ctl.node_info(NodeId(str(n))))}
    assert len(lost) == 2 and fabrics == {A, B}
    assert sorted(map(str, run.of("node.loss_paced"))) == sorted(set(silent) - set(map(str, lost)))
    assert len(run.of("replica.failed")) == 2
    for name in set(silent) - set(map(str, lost)):
        assert run.ctl.node_state(NodeId(name)) is NodeState.SUSPECT
    assert run.ctl.paced() == sorted(set(silent) - set(map(str, lost)))
    # the kept replicas: live, counted (no replacement for them), neither ready nor routed
    assert len(run.ctl.live_replicas(M)) == 12  # 10 kept or healthy, 2 replacements pending
    assert len(run.ctl.ready_replicas(M)) == 7
    assert len(run.router.routes(M)) == 7
    # the link returns before their turn: they serve again, untouched
    run.run(80_000, 90_000, heard + silent)
    assert len(run.of("node.lost")) == 2 and len(run.of("replica.failed")) == 2
    assert len(run.router.routes(M)) == 10
    assert run.ctl.paced() == []
    assert run.of("node.loss_paced").count("n03") == 1  # said once per silence


def test_paced_nodes_that_stay_silent_are_lost_as_the_budget_refills() -> None:
    timings = replace(T, eviction_budget=2, eviction_fabric_budget=1)
    run = Run(TWELVE, replicas=12, timings=timings)
    run.up(1_000)
    silent = ["n01", "n02", "n03", "n05", "n06"]
    heard = [n for n, _ in TWELVE if n not in silent]
    run.run(2_000, 300_000, heard)
    times = [t for t, k, _ in run.events if k == "node.lost"]
    assert len(times) == 5
    for t in times:  # never more than two within any window
        assert sum(1 for u in times if t <= u < t + 60_000) <= 2


def test_without_a_budget_every_silent_node_is_lost_at_once() -> None:
    timings = replace(T, eviction_budget=0, eviction_fabric_budget=0)
    run = Run(TWELVE, replicas=12, timings=timings)
    run.up(1_000)
    silent = ["n01", "n02", "n03", "n05", "n06"]
    run.run(2_000, 80_000, [n for n, _ in TWELVE if n not in silent])
    assert len(run.of("node.lost")) == 5 and not run.of("node.loss_paced")


# --- the mass-loss hold's bound -----------------------------------------------------------------


def test_a_hold_ends_after_its_bound_and_the_loss_is_paced() -> None:
    timings = replace(T, mass_loss_hold_max_ms=120_000, eviction_budget=2)
    run = Run(EIGHT, replicas=8, timings=timings)
    run.up(1_000)
    silent = ["n1", "n2", "n3", "n5", "n6"]  # 5 of 8: held
    heard = ["n4", "n7", "n8"]
    run.run(2_000, 150_000, heard)
    assert run.ctl.held() and not run.of("node.lost")
    assert len(run.ctl.ready_replicas(M)) == 8  # within its bound a hold keeps routes
    hold_at = next(t for t, k, _ in run.events if k == "fleet.hold")
    run.run(150_000, hold_at + 120_000, heard)
    assert not run.of("fleet.loss_accepted")
    run.run(hold_at + 120_000, hold_at + 121_000, heard)
    assert run.of("fleet.loss_accepted") and not run.ctl.held() and run.ctl.loss_accepted()
    # the silent nodes' replicas are capacity no more: not ready, not routed
    assert len(run.ctl.ready_replicas(M)) == 3
    assert len(run.router.routes(M)) == 3
    assert len(run.of("node.lost")) == 2  # at the pace, not all at once
    run.run(hold_at + 121_000, hold_at + 400_000, heard)
    assert sorted(map(str, run.of("node.lost"))) == silent
    assert run.of("fleet.hold") == [None]  # the accepted silence is not held again
    assert len(run.ctl.ready_replicas(M)) == 3  # nowhere to place the rest: 8 GPUs a node


def test_a_restarted_controller_holds_from_the_same_start_and_keeps_held_nodes() -> None:
    timings = replace(T, mass_loss_hold_max_ms=300_000)
    run = Run(EIGHT, replicas=8, timings=timings)
    run.up(1_000)
    heard = ["n4", "n7", "n8"]
    run.run(2_000, 200_000, heard)
    hold_at = next(t for t, k, _ in run.events if k == "fleet.hold")
    # the controller restarts from its store, silent nodes long past the lost window
    after = Run(EIGHT, replicas=8, timings=timings, restored=run.state)
    after.apply(after.ctl.start(200_000))
    for name in heard:
        after.beat(name, 200_100)
    after.run(201_000, hold_at + 300_000, heard)
    assert after.of("fleet.hold") and not after.of("node.lost")
    assert not after.of("replica.failed")
    assert not after.of("fleet.loss_accepted")
    after.run(hold_at + 300_000, hold_at + 301_000, heard)
    assert after.of("fleet.loss_accepted")


def test_a_restart_restores_a_node_lost_only_if_its_loss_was_declared() -> None:
    timings = replace(T, eviction_budget=1, eviction_fabric_budget=0)
    run = Run(TWELVE, replicas=12, timings=timings)
    run.up(1_000)
    silent = ["n01", "n05"]
    heard = [n for n, _ in TWELVE if n not in silent]
    run.run(2_000, 90_000, heard)
    (lost,) = run.of("node.lost")
    (paced,) = run.of("node.loss_paced")
    after = Run(TWELVE, replicas=12, timings=timings, restored=run.state)
    after.apply(after.ctl.start(90_000))
    assert after.ctl.node_state(NodeId(str(lost))) is NodeState.LOST
    assert after.ctl.node_state(NodeId(str(paced))) is not NodeState.LOST
    for name in heard:
        after.beat(name, 90_100)
    after.run(91_000, 93_000, heard)
    # the successor's fresh budget declares the paced node lost, once
    assert after.of("node.lost") == [paced]


# --- moves within the budget --------------------------------------------------------------------


def test_a_drain_moves_no_more_replicas_per_window_than_the_budget() -> None:
    timings = replace(T, eviction_budget=1)
    nodes = [("n1", "ib-a"), ("n2", "ib-a")]
    run = Run(nodes, replicas=4, timings=timings, gpus=2)  # four 2-GPU replicas
    run.up(1_000)
    on_n1 = len(run.ctl.replicas_on(NodeId("n1")))
    assert on_n1 >= 2
    run.apply(run.ctl.handle(Drain(NodeId("n1")), 3_000))
    run.run(3_000, 40_000, ["n1", "n2"])
    assert len([k for _, k, _ in run.events if k == "replica.moving"]) == 1
    run.run(40_000, 64_000, ["n1", "n2"])
    assert len([k for _, k, _ in run.events if k == "replica.moving"]) == 2
