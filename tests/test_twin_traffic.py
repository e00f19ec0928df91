"""Traffic in the twin: the `traffic` section and `requests` expectations load as documented,
requests go through the routing core with `routes_to_ready` judged on every pick, and the
counts say what a client saw: across a node loss, a controller restart, a replica dying under
its requests."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from llmgw_twin.control.model import ModelName, TraceEvent
from llmgw_twin.control.routing import Router
from llmgw_twin.control.routing_feed import LEAVES
from llmgw_twin.twin.report.text import to_json
from llmgw_twin.twin.scenario.loader import ScenarioError, load_scenario, load_scenario_text
from llmgw_twin.twin.scenario.model import RequestsExpectation, Scenario, Traffic
from llmgw_twin.twin.scenario.timescale import scale_scenario, widen
from llmgw_twin.twin.world.runner import RunResult, run_scenario

M = ModelName("m")
ROOT = Path(__file__).resolve().parent.parent
NODE_LOSS = ROOT / "scenarios" / "node-loss-traffic.yaml"

BASE = """\
name: t
duration: 2m
cluster:
  fabrics: {ib-a: [n1, n2]}
profiles:
  p: {engine: sim, nodes: 1, gpus_per_node: 8, load_time: 10s, model: /m}
deployments:
  - {model: m, profile: p, replicas: REPLICAS}
"""


def scenario(extra: str, replicas: int = 2) -> Scenario:
    return load_scenario_text(BASE.replace("REPLICAS", str(replicas)) + textwrap.dedent(extra))


def error(extra: str) -> str:
    with pytest.raises(ScenarioError) as err:
        scenario(extra)
    return str(err.value)


def counts(result: RunResult, model: str = "m") -> dict[str, int]:
    assert result.requests is not None
    return result.requests[model]


def first(result: RunResult, kind: str, **subjects: object) -> TraceEvent:
    return next(
        e
        for e in result.trace
        if e.kind == kind and all(e.get(k) == v for k, v in subjects.items())
    )


# --- loading ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rate", "count", "every_ms"),
    [
        ("5/s", 1, 200),
        ("0.5/s", 1, 2_000),
        ("3/s", 3, 1_000),
        ("90/min", 3, 2_000),
        ("1/h", 1, 3_600_000),
    ],
)
def test_a_rate_is_an_exact_fraction(rate: str, count: int, every_ms: int) -> None:
    s = scenario(f"traffic: {{model: m, rate: {rate}}}\n")
    assert s.traffic == (Traffic(M, count, every_ms, 32, s.traffic[0].line),)


def test_arrivals_are_evenly_spaced_and_counted_inclusively() -> None:
    t = Traffic(M, 3, 1_000, 1)
    assert [t.arrival_ms(i) for i in range(4)] == [0, 333, 666, 1_000]
    assert t.requests_until(999) == 3 and t.requests_until(1_000) == 4


def test_traffic_forms_and_the_requests_expectation() -> None:
    s = scenario(
        """\
        traffic:
          - {model: m, rate: 2/s, tokens: 100}
        expect:
          - requests: {model: m, failed_max: 3}
          - requests: {model: m, failed_max: 0}
            within: [30s, end]
        """
    )
    assert s.traffic[0].tokens == 100
    whole, window = s.expectations
    assert whole == RequestsExpectation(
        M, 3, 0, 120_000, whole.line, "requests model=m failed_max=3"
    )
    assert (window.start_ms, window.end_ms) == (30_000, 120_000)  # type: ignore[union-attr]
    assert window.text == "requests model=m failed_max=0 within [30s, end]"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("traffic: {model: m, rate: fast}\n", "traffic.rate: 'fast' is not a rate"),
        ("traffic: {model: m, rate: 0/s}\n", "traffic.rate: the rate must be more than 0"),
        ("traffic: {model: m, rate: 20000/s}\n", "more than the 10,000/s"),
        ("traffic: {model: x, rate: 1/s}\n", "traffic.model: 'x' is not a deployed model"),
        ("traffic: {model: m}\n", "'rate'"),
        ("traffic: {model: m, rate: 1/s, burst: 2}\n", "burst"),
        ("traffic: {model: m, rate: 1/s, tokens: 0}\n", "traffic.tokens"),
        ("traffic: [{model: m, rate: 1/s}, {model: m, rate: 2/s}]\n", "already has traffic"),
        (
            "expect:\n  - requests: {model: m, failed_max: 0}\n",
            "no traffic is sent to 'm'",
        ),
        (
            "traffic: {model: m, rate: 1/s}\nexpect:\n  - requests: {model: m}\n",
            "'failed_max'",
        ),
        (
            "traffic: {model: m, rate: 1/s}\n"
            "expect:\n  - requests: {model: m, failed_max: 0}\n    at: 1m\n",
            "more than one of 'event', 'at' and 'requests'",
        ),
    ],
)
def test_bad_traffic_is_refused_with_where_and_why(extra: str, message: str) -> None:
    assert message in error(extra)


def test_a_run_asking_for_too_many_requests_is_refused() -> None:
    text = BASE.replace("REPLICAS", "1").replace("duration: 2m", "duration: 300h")
    with pytest.raises(ScenarioError) as err:
        load_scenario_text(text + "traffic: {model: m, rate: 1/s}\n")  # 1,080,001
    assert "requests, more than the 1,000,000 allowed" in str(err.value)


def test_time_scale_keeps_the_requests_and_narrows_their_windows() -> None:
    s = load_scenario(NODE_LOSS)
    fast = scale_scenario(s, 0.1)
    assert fast.traffic[0].requests_until(fast.duration_ms) == s.traffic[0].requests_until(
        s.duration_ms
    )
    (req,) = [e for e in widen(fast, 1_000).expectations if isinstance(e, RequestsExpectation)]
    assert (req.start_ms, req.end_ms) == (3_000 + 1_000, fast.duration_ms - 1_000)


# --- running ---------------------------------------------------------------------------------


def test_node_loss_under_traffic_loses_no_request_once_both_replicas_serve() -> None:
    result = run_scenario(load_scenario(NODE_LOSS))
    assert result.passed
    c = counts(result, "llama-70b")
    kill = first(result, "fault.injected").t_ms
    lost = first(result, "node.lost").t_ms
    both_ready = [e.t_ms for e in result.trace if e.kind == "replica.ready"][1]
    assert c["sent"] == 6 * 60 * 5 + 1 and c["served"] + c["failed"] == c["sent"]
    # every failure arrived before the replicas first served, when no replica could take it:
    # none between the kill and the loss (the stalled replica was avoided or retried), none after
    assert c["failed"] == c["failed_no_replica"] == both_ready // 200
    assert c["failed_in_flight"] == 0 and c["retried"] >= 1
    assert kill < lost
    invariants = {i.name: i for i in result.invariants}
    assert invariants["routes_to_ready"].checks >= c["sent"] - c["failed_no_replica"]
    assert invariants["routes_to_ready"].violations == ()


def test_traffic_does_not_change_the_trace() -> None:
    plain = load_scenario(ROOT / "scenarios" / "node-loss.yaml")
    with_traffic = run_scenario(load_scenario(NODE_LOSS))
    assert run_scenario(plain).trace_sha256 == with_traffic.trace_sha256
    again = run_scenario(load_scenario(NODE_LOSS))
    assert again.requests == with_traffic.requests
    report = to_json(with_traffic, wall_ms=0)
    assert json.loads(json.dumps(report))["requests"] == {
        "llama-70b": counts(with_traffic, "llama-70b")
    }


def test_a_controller_restart_under_traffic_fails_no_request() -> None:
    result = run_scenario(load_scenario(ROOT / "scenarios" / "controller-restart-traffic.yaml"))
    assert result.passed, [o.message for o in result.expectations]
    c = counts(result, "llama-70b")
    assert c["failed"] == c["failed_no_replica"]  # only before the first replicas served
    ready = first(result, "replica.ready").t_ms
    assert c["failed"] <= ready // 200 + 1


def test_requests_on_a_replica_that_dies_under_them_fail_in_flight() -> None:
    # one replica, answers of about 20 s: killing its engine at 1m cuts the 20 requests it holds
    # (those that arrived from 40 s on); their retry finds no other replica, and nor do the
    # requests that arrive until the replacement is ready
    s = scenario(
        """\
        faults:
          - {id: k, at: 1m, kill_engine: {node: n1, replica_of: m}}
        traffic: {model: m, rate: 1/s, tokens: 10000}
        expect:
          - requests: {model: m, failed_max: 0}
            within: [30s, k-21s]
          - requests: {model: m, failed_max: 19}
            within: [k-20s, k-1s]
        """,
        replicas=1,
    )
    result = run_scenario(s)
    c = counts(result)
    first_ok, cut = result.expectations
    assert first_ok.passed, first_ok.message
    assert not cut.passed and cut.message.startswith("20 of 20 requests arriving")
    assert c["failed_in_flight"] == 20 and c["retried"] == 20
    ready = [e.t_ms for e in result.trace if e.kind == "replica.ready"]
    waiting = sum(
        1 for t in range(0, 121) if t * 1_000 < ready[0] or 60_000 <= t * 1_000 < ready[1]
    )
    # a request arriving in the very millisecond its replica becomes ready finds it or not, as
    # the order of that instant's events has it (the reconcile's relay, `reconciles.py`)
    tied = sum(1 for t in range(0, 121) if t * 1_000 in ready)
    assert c["failed"] == c["failed_no_replica"]
    assert 20 + waiting <= c["failed"] <= 20 + waiting + tied


def test_routes_to_ready_catches_a_router_that_keeps_a_dead_replica(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = Router.follow

    def ignore_leaves(self: Router, ev: TraceEvent) -> None:
        if ev.kind not in LEAVES:
            real(self, ev)

    monkeypatch.setattr(Router, "follow", ignore_leaves)
    result = run_scenario(load_scenario(NODE_LOSS))
    (check,) = [i for i in result.invariants if i.name == "routes_to_ready"]
    assert check.violations and "llama-70b-r1" in check.violations[0]
