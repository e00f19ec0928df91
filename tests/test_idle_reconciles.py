"""Reconciles that cost nothing when nothing changed (`control/wake.py`): the core says when it
next needs a reconcile, and one that skips every reconcile before it decides exactly what one
reconciled at every instant of the grid decides. The twin's side (`twin/world/reconciles.py`):
every scenario file and 300 fuzzed seeds keep their trace hashes (checked when it was built;
`tests/test_twin_bulk.py` and `tests/test_scenarios.py` run the files)."""

from __future__ import annotations

from llmgw_twin.control.controller import QUIET_STEP, Controller
from llmgw_twin.control.model import (
    Deployment,
    EngineName,
    FabricId,
    ModelName,
    NodeId,
    NodeInfo,
    Profile,
    ProfileName,
    ShardReport,
    ShardState,
    Timings,
    TraceEvent,
)
from llmgw_twin.control.protocol import (
    ApplyDeployment,
    ApplyProfile,
    Heartbeat,
    NodeRegistered,
    Step,
)
from llmgw_twin.control.wake import on_grid_at_or_after

T = Timings()
NODES = [NodeId(f"n{i}") for i in range(4)]
PROFILE = Profile(ProfileName("p"), EngineName("sim"), 1, 1, "m")


def up(core: Controller, node: NodeId) -> tuple[ShardReport, ...]:
    """The node runs what it was assigned, serving."""
    return tuple(
        ShardReport(s, ShardState.SERVING, f"http://{node}:{8000 + s.gpus[0]}", None, ())
        for s in core.assigned(node)
    )


def drive(lazy: bool, silent: NodeId, silent_from_ms: int, end_ms: int) -> list[TraceEvent]:
    """A fleet of four nodes and two replicas; `silent` stops heartbeating at
    `silent_from_ms`, so it turns suspect and is lost and its replica replaced. Inputs come
    first in their instant, then the reconcile: at every instant of the grid, or (`lazy`) only
    where the core asked for one."""
    core = Controller(T)
    events: list[TraceEvent] = []

    def take(step: Step, now: int) -> int | None:
        events.extend(step.events)
        return step.wake_at_ms

    wake = take(core.start(0), 0)
    for node in NODES:
        take(
            core.handle(
                NodeRegistered(NodeInfo(node, FabricId("f"), 8, 80_000, (EngineName("sim"),))), 0
            ),
            0,
        )
    take(core.handle(ApplyProfile(PROFILE), 0), 0)
    asked = take(core.handle(ApplyDeployment(Deployment(ModelName("m"), PROFILE.name, 2)), 0), 0)
    assert asked == 1_000  # an input that changed something asks for the next reconcile
    beats = {node: 300 + 1_700 * i for i, node in enumerate(NODES)}  # phases in the interval
    ticks = skipped = 0
    for now in range(1, end_ms + 1):
        for node, at in beats.items():
            if at == now:
                beats[node] = at + T.heartbeat_interval_ms
                if node == silent and now >= silent_from_ms:
                    continue
                got = take(core.handle(Heartbeat(node, up(core, node)), now), now)
                if got is not None:
                    wake = got if wake is None else min(wake, got)
        if now % T.reconcile_interval_ms:
            continue
        if lazy and (wake is None or now < wake):
            skipped += 1
            continue
        ticks += 1
        wake = take(core.tick(now), now)
    if lazy:
        assert skipped > ticks  # the quiet stretches were skipped
    return events


def test_a_core_that_skips_idle_reconciles_decides_what_one_reconciled_always_does() -> None:
    end = 300_000
    eager = drive(False, NODES[1], 120_000, end)
    lazy = drive(True, NODES[1], 120_000, end)
    kinds = [e.kind for e in eager]
    assert "node.suspect" in kinds and "node.lost" in kinds and kinds.count("replica.placed") >= 3
    assert lazy == eager


def test_an_idle_core_asks_for_its_earliest_deadline_on_the_grid() -> None:
    core = Controller(T)
    core.start(0)
    info = NodeInfo(NODES[0], FabricId("f"), 8, 80_000, (EngineName("sim"),))
    assert core.handle(NodeRegistered(info), 400).wake_at_ms == 1_000
    core.tick(1_000)
    step = core.tick(2_000)  # nothing under way: the node's silence turns it suspect at 30.4 s
    assert step.wake_at_ms == 11_000  # before that, the store's clock is written again
    assert core.handle(Heartbeat(NODES[0]), 10_400) is QUIET_STEP  # a quiet one asks nothing
    assert core.tick(11_000).wake_at_ms == 21_000
    assert core.tick(21_000).wake_at_ms == 31_000
    assert not core.reconcile_would_act(30_999)
    assert core.reconcile_would_act(40_400)  # the node's suspect deadline (heard at 10.4 s)
    events = core.tick(41_000).events
    assert [e.kind for e in events] == ["node.suspect"]
    assert core.reconcile_would_act(41_001)  # a suspect node: every reconcile counts


def test_the_grid_instant_at_or_after() -> None:
    assert on_grid_at_or_after(5_000, 1_000, 3_500) == 5_000  # none before the next due
    assert on_grid_at_or_after(5_000, 1_000, 5_000) == 5_000
    assert on_grid_at_or_after(5_000, 1_000, 5_001) == 6_000
    assert on_grid_at_or_after(5_000, 1_000, 8_000) == 8_000
    assert on_grid_at_or_after(5_080, 1_000, 9_999) == 10_080
