"""How real mode judges: state assertions read from their instant until one holds (never at or
after the next fault), `never` windows narrowed, the fidelity table's events taken from each
expectation's window only, and control decisions compared per replica and per node.

Pure functions on literal traces and states, and the runner's reading loop against a live HTTP
server standing in for the controller's admin state."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI

from helpers.live import live_server
from llmgw_twin.control.model import TraceEvent
from llmgw_twin.realmode.checks import (
    STATE_MARGIN_MS,
    Reading,
    judge_state_readings,
    read_state,
    state_span,
)
from llmgw_twin.realmode.report import decision_differences, fidelity, fidelity_table
from llmgw_twin.realmode.runner import RealResult, RealRun
from llmgw_twin.twin.scenario.loader import load_scenario_text
from llmgw_twin.twin.scenario.model import EventExpectation, Scenario, StateExpectation
from llmgw_twin.twin.scenario.timescale import widen
from llmgw_twin.twin.world.runner import RunResult

SCENARIO = """\
name: judging
duration: 60s
cluster:
  fabrics:
    ib-a: [node01, node02]
    ib-b: [node03, node04]
  nodes:
    default: {gpus: 8, engines: [sim]}
profiles:
  p2: {engine: sim, nodes: 2, gpus_per_node: 4, load_time: 5s, model: /models/m}
deployments:
  - {model: m, profile: p2, replicas: 1}
faults:
  - id: kill
    at: 30s
    kill_node: node02
expect:
  - at: 29s
    ready_replicas: {m: 1}
    node_state: {node02: alive}
  - event: node.lost
    node: node02
    within: [kill+5s, kill+20s]
  - event: replica.ready
    fabric: ib-a
    within: [kill, end]
    never: true
  - at: end
    ready_replicas: {m: 1}
"""


def scenario() -> Scenario:
    return load_scenario_text(SCENARIO, "judging.yaml")


def states(s: Scenario) -> list[StateExpectation]:
    return [e for e in s.expectations if isinstance(e, StateExpectation)]


def events(s: Scenario) -> list[EventExpectation]:
    return [e for e in s.expectations if isinstance(e, EventExpectation)]


def admin_state(ready: int, node02: str = "alive") -> dict[str, Any]:
    """The controller's admin state, as `GET /v1/admin/state` shapes it, cut to what is read."""
    nodes = [
        {"node": n, "state": node02 if n == "node02" else "alive", "gpus": [{"replica": None}]}
        for n in ("node01", "node02", "node03", "node04")
    ]
    replicas = [
        {"replica": f"m-r{i + 1}", "model": "m", "state": "ready", "fabric": "ib-a"}
        for i in range(ready)
    ]
    return {"nodes": nodes, "replicas": replicas}


# --- state assertions --------------------------------------------------------------------------


def test_widen_keeps_a_state_assertions_instant_and_narrows_never_on_both_sides() -> None:
    s = scenario()
    wide = widen(s, 2_000)
    assert [e.at_ms for e in states(wide)] == [29_000, 60_000]  # judged at the instant itself
    lost, never = events(wide)
    assert (lost.start_ms, lost.end_ms) == (33_000, 52_000)
    assert never.never and (never.start_ms, never.end_ms) == (32_000, 58_000)
    (short,) = [e for e in events(widen(s, 20_000)) if e.never]
    assert (short.start_ms, short.end_ms) == (45_000, 45_000)  # too short: its midpoint only


def test_an_assertion_just_before_a_fault_is_never_read_at_or_after_it() -> None:
    before, end = states(scenario())
    faults = [30_000]
    assert state_span(before, faults, 2_000) == 30_000 - STATE_MARGIN_MS  # not 31s: after kill
    assert state_span(before, faults, 500) == 29_500  # the tolerance, when it ends first
    assert state_span(end, faults, 2_000) == 62_000  # no fault after it
    assert state_span(before, [29_050], 2_000) == 29_000  # a fault within the margin: one reading
    assert state_span(before, [29_000, 40_000], 2_000) == 31_000  # a fault at the instant itself


def test_a_state_judged_late_passes_on_the_first_reading_that_holds_and_says_how_late() -> None:
    exp = states(scenario())[0]
    readings = [
        read_state(exp, 29_010, admin_state(0)),
        read_state(exp, 29_120, None),  # the controller did not answer this one
        read_state(exp, 29_400, admin_state(1)),
    ]
    assert [r.held for r in readings] == [False, False, True]
    outcome = judge_state_readings(exp, readings, 29_900)
    assert outcome.passed, outcome.message
    assert outcome.message == "at 29.000s: m ready 1, node02 alive (read +0.400s after)"


def test_a_reading_past_the_span_does_not_count() -> None:
    exp = states(scenario())[0]
    readings = [read_state(exp, 29_010, admin_state(0)), read_state(exp, 30_050, admin_state(1))]
    outcome = judge_state_readings(exp, readings, 29_900)
    assert not outcome.passed
    assert outcome.message.startswith("at 29.000s: m: 0 ready replicas, want 1")


def test_every_assertion_of_a_reading_is_checked_and_the_last_reading_is_reported() -> None:
    exp = states(scenario())[0]
    readings = [
        read_state(exp, 29_000, admin_state(0)),
        read_state(exp, 29_500, admin_state(1, node02="suspect")),
    ]
    assert readings[1].problems == ("node02 is suspect, want alive",)
    outcome = judge_state_readings(exp, readings, 29_900)
    assert not outcome.passed
    assert outcome.message == (
        "at 29.000s: node02 is suspect, want alive (read 2 times to 29.900s, none held)"
    )
    silent = judge_state_readings(exp, [Reading(29_000, None), Reading(29_100, None)], 29_900)
    assert not silent.passed and silent.message == "at 29.000s: the controller did not answer"


def test_the_first_reading_counts_even_when_its_answer_comes_after_the_span() -> None:
    exp = states(scenario())[0]
    outcome = judge_state_readings(exp, [read_state(exp, 29_300, admin_state(1))], 29_000)
    assert outcome.passed and outcome.message == "at 29.000s: m ready 1, node02 alive"


def test_the_runner_reads_again_until_the_state_holds_and_only_within_its_span(
    tmp_path: Path,
) -> None:
    """The reading loop of a real run against a stand-in for the controller's admin API: the
    state is right from the fourth read on."""
    reads: list[int] = []

    def app() -> FastAPI:
        api = FastAPI()

        @api.get("/v1/admin/state")
        def state() -> dict[str, Any]:
            reads.append(1)
            return admin_state(1 if len(reads) >= 4 else 0)

        return api

    s = scenario()
    exp = states(s)[0]
    # the assertion's instant is the run's zero, which is when each judging starts
    late = StateExpectation(0, ready_replicas=exp.ready_replicas, text=exp.text, line=exp.line)
    with live_server(app) as url:
        run = RealRun(s, tmp_path / "run", tolerance_ms=30_000)
        run.cluster.controller_url = url

        async def judge(end_ms: int) -> None:
            run.t0 = time.monotonic()  # the instant 0 of the run is now
            async with httpx.AsyncClient(timeout=5.0) as client:
                await run._judge_state(client, 0, late, end_ms)

        asyncio.run(judge(30_000))  # a span long enough for every read it takes
        assert len(reads) == 4 and run.outcomes[0].passed, run.outcomes[0].message
        assert "read +" in run.outcomes[0].message
        reads.clear()
        asyncio.run(judge(0))  # the next fault is at the instant: one reading, no more
        assert len(reads) == 1 and not run.outcomes[0].passed
        assert run.outcomes[0].message == "at 0.000s: m: 0 ready replicas, want 1"


# --- the fidelity table and the decisions -------------------------------------------------------


def ev(t: int, kind: str, **subjects: Any) -> TraceEvent:
    return TraceEvent.of(t, kind, **subjects)


def placed(t: int, rid: str, fabric: str, nodes: tuple[str, ...]) -> TraceEvent:
    return ev(t, "replica.placed", model="m", replica=rid, fabric=fabric, nodes=nodes)


def ready(t: int, rid: str, fabric: str, nodes: tuple[str, ...]) -> TraceEvent:
    return ev(t, "replica.ready", model="m", replica=rid, fabric=fabric, nodes=nodes)


A, B = ("node01", "node02"), ("node03", "node04")
TWIN = [
    ev(2, "node.joined", node="node01", fabric="ib-a"),
    ev(2, "node.joined", node="node02", fabric="ib-a"),
    ev(2, "node.joined", node="node03", fabric="ib-b"),
    placed(1_000, "m-r1", "ib-a", A),
    ready(6_000, "m-r1", "ib-a", A),
    ev(30_000, "fault.injected", fault="kill", action="kill_node", node="node02"),
    ev(36_000, "node.suspect", node="node02", fabric="ib-a"),
    ev(42_000, "node.lost", node="node02", fabric="ib-a"),
    ev(42_000, "replica.failed", model="m", replica="m-r1", fabric="ib-a", node="node02"),
    ev(42_000, "replica.reaped", model="m", replica="m-r1", fabric="ib-a", reason="node lost"),
    placed(42_000, "m-r2", "ib-b", B),
    ready(47_000, "m-r2", "ib-b", B),
]


def real_trace(**shift: int) -> list[TraceEvent]:
    """The twin's story as real processes tell it: joins in another order, before zero, each
    event a little late, a suspect blip on node03 that the heartbeat phase brings."""
    late = shift.get("late", 300)
    joins = [
        ev(-900, "node.joined", node="node03", fabric="ib-b"),
        ev(-700, "node.joined", node="node01", fabric="ib-a"),
        ev(-650, "node.joined", node="node02", fabric="ib-a"),
    ]
    rest = [TraceEvent(e.t_ms + late, e.kind, e.subjects) for e in TWIN[3:]]
    blip = [
        ev(20_000, "node.suspect", node="node03", fabric="ib-b"),
        ev(20_400, "node.recovered", node="node03", fabric="ib-b"),
    ]
    return sorted([*joins, *rest, *blip], key=lambda e: e.t_ms)


def results(real: list[TraceEvent], twin: list[TraceEvent] = TWIN) -> tuple[RunResult, RealResult]:
    s = scenario()
    twin_result = RunResult(s, 1, tuple(twin), (), (), s.duration_ms, 0)
    real_result = RealResult(widen(s, 2_000), 0.1, 2_000, real, [], [], wall_ms=60_000)
    return twin_result, real_result


def test_the_same_decisions_whatever_the_joins_order_and_blips() -> None:
    assert decision_differences(TWIN, real_trace()) == []
    twin, real = results(real_trace())
    fid = fidelity(twin, real)
    assert fid.same and fid.as_json()["differences"] == []
    assert "same control decisions per replica and node: yes" in fidelity_table(
        fid.rows, fid.same, fid.differences
    )


def test_a_replacement_placed_elsewhere_is_named_with_what_each_run_decided() -> None:
    real = [
        e if e.get("replica") != "m-r2" else ev(e.t_ms, e.kind, **{**dict(e.subjects), **_on_a()})
        for e in real_trace()
    ]
    diffs = decision_differences(TWIN, real)
    assert diffs == [
        "replica m-r2: twin placed ib-b node03+node04, ready; real placed ib-a node01+node02, ready"
    ]
    twin, result = results(real)
    fid = fidelity(twin, result)
    assert not fid.same
    table = fidelity_table(fid.rows, fid.same, fid.differences)
    assert "same control decisions per replica and node: no\n  replica m-r2: twin placed" in table


def _on_a() -> dict[str, Any]:
    return {"fabric": "ib-a", "nodes": A}


def test_a_node_lost_and_back_differs_from_one_lost_for_good() -> None:
    back = [*real_trace(), ev(50_000, "node.recovered", node="node02", fabric="ib-a")]
    assert decision_differences(TWIN, back) == ["node node02: twin lost; real lost, recovered"]


def test_decisions_past_the_runs_end_are_not_compared() -> None:
    after = [*real_trace(), placed(61_000, "m-r3", "ib-a", A)]
    assert decision_differences(TWIN, after, end_ms=60_000) == []
    assert decision_differences(TWIN, after) == [
        "replica m-r3: twin nothing; real placed ib-a node01+node02"
    ]


def test_the_fidelity_table_takes_events_from_the_window_only_and_says_none() -> None:
    # the twin loses node02 inside the window; the real run loses it only long after the window
    late_loss = [
        e if e.kind != "node.lost" else TraceEvent(57_500, e.kind, e.subjects) for e in real_trace()
    ]
    twin, real = results(sorted(late_loss, key=lambda e: e.t_ms))
    (row,) = fidelity(twin, real).rows  # the `never` expectation has no row
    assert row == {
        "expectation": "event node.lost node=node02 within [kill+5s, kill+20s]",
        "virtual_ms": 42_000,
        "real_ms": None,
        "difference_ms": None,
    }
    line = fidelity_table([row], False).splitlines()[1]
    assert line.split()[:3] == ["42.000s", "none", "-"]
    # in the window (widened by the tolerance) it is found, and the difference given
    twin, real = results(real_trace(late=1_500))
    (row,) = fidelity(twin, real).rows
    assert (row["virtual_ms"], row["real_ms"], row["difference_ms"]) == (42_000, 43_500, 1_500)


def test_an_event_before_the_window_is_not_taken_for_the_expected_one() -> None:
    early = [ev(31_000, "node.lost", node="node02", fabric="ib-a"), *real_trace()]
    twin, real = results(sorted(early, key=lambda e: e.t_ms))
    (row,) = fidelity(twin, real).rows
    assert row["real_ms"] == 42_300  # not 31 s: that one is outside [33 s, 52 s]


def test_a_count_holds_between_what_surely_and_what_may_fall_inside() -> None:
    """`count: 0` after a fault at 10 s, tolerance 2 s: a start at 9.5 s (before the fault, but
    inside the widened window) does not break it; one at 13 s (surely after) does. `count: 1`
    with one event just outside the file's window but inside the widened one holds too."""
    from llmgw_twin.realmode.checks import judge_event_real

    def started(*at_s: float) -> list[TraceEvent]:
        return [TraceEvent.of(int(t * 1000), "shard.started", node="n1") for t in at_s]

    none_after = EventExpectation("shard.started", (), 10_000 - 2_000, 60_000, count=0)
    assert judge_event_real(none_after, started(9.5), 2_000).passed
    assert not judge_event_real(none_after, started(9.5, 13.0), 2_000).passed
    one = EventExpectation("shard.started", (), 10_000 - 2_000, 20_000 + 2_000, count=1)
    assert judge_event_real(one, started(21.0), 2_000).passed
    assert not judge_event_real(one, started(), 2_000).passed
    assert not judge_event_real(one, started(12.0, 15.0), 2_000).passed


def adopted(t: int, rid: str, nodes: tuple[str, ...], is_ready: bool) -> TraceEvent:
    return ev(
        t, "replica.adopted", model="m", replica=rid, fabric="ib-a", nodes=nodes, ready=is_ready
    )


def test_an_adoption_while_loading_then_ready_is_the_adoption_of_a_ready_replica() -> None:
    """Whether the engine finished loading before the restarted controller heard it is a race
    of start-up times: adopted loading then ready, or adopted ready, is one decision."""
    twin = [placed(1_000, "m-r1", "ib-a", A), adopted(9_000, "m-r1", A, True)]
    loading = [
        placed(1_000, "m-r1", "ib-a", A),
        adopted(9_100, "m-r1", A, False),
        ready(9_300, "m-r1", "ib-a", A),
    ]
    assert decision_differences(twin, loading) == []
    assert decision_differences(loading, twin) == []
    never_ready = [placed(1_000, "m-r1", "ib-a", A), adopted(9_100, "m-r1", A, False)]
    assert decision_differences(twin, never_ready) == [
        "replica m-r1: twin placed ib-a node01+node02, adopted ib-a node01+node02 ready=True; "
        "real placed ib-a node01+node02, adopted ib-a node01+node02 ready=False"
    ]
