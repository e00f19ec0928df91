"""The autoscaler (`control/autoscale.py`, `deployments[].autoscale`): a deployment's count
follows its load within bounds, holds its latency objective with fewer replica-hours than the
fixed count it peaks at, and never flaps, never fights a move, comes back from zero at once.

The scenario runs (`scenarios/autoscale-diurnal.yaml`) are compared with the same load at fixed
counts; the policy's own rules are checked on made-up samples."""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path

import pytest

from llmgw_twin.control.autoscale import AutoscalePolicy, Autoscaler, LoadSample
from llmgw_twin.control.model import ModelName
from llmgw_twin.twin.report.capacity import replica_ms
from llmgw_twin.twin.scenario.loader import ScenarioError, load_scenario_text
from llmgw_twin.twin.world.runner import RunResult, run_scenario

ROOT = Path(__file__).resolve().parent.parent
DIURNAL = (ROOT / "scenarios" / "autoscale-diurnal.yaml").read_text()
M = ModelName("chat")


def _fixed(count: int) -> str:
    """The diurnal file with the autoscaler taken out and `count` replicas throughout."""
    text, n = re.subn(
        r"    replicas: 1\n    autoscale:\n(      .*\n)+", f"    replicas: {count}\n", DIURNAL
    )
    assert n == 1
    slo = "  - slo: {model: llama-8b, ttft_p99: 1s, attainment: 99%}\n    within: [1m, end]\n"
    return text.split("\nexpect:\n")[0] + "\nexpect:\n" + slo


def _run(text: str) -> RunResult:
    return run_scenario(load_scenario_text(text, "autoscale.yaml"))


def test_the_autoscaler_holds_the_objective_with_fewer_replica_hours() -> None:
    scaled = _run(DIURNAL)
    assert scaled.passed, [o.message for o in scaled.expectations if not o.passed]
    peak = max(int(str(e.get("replicas"))) for e in scaled.trace if e.kind == "deployment.scaled")
    at_peak = _run(_fixed(peak))
    one = _run(_fixed(1))
    assert at_peak.passed  # the peak's count holds it too ...
    used = replica_ms(scaled.trace, scaled.virtual_ms)["llama-8b"]
    fixed = replica_ms(at_peak.trace, at_peak.virtual_ms)["llama-8b"]
    assert used < 0.8 * fixed  # ... at a fifth more cost at least
    assert not one.passed  # and the low count does not hold it


def _policy(**kw: object) -> AutoscalePolicy:
    base: dict[str, object] = dict(
        model=M,
        minimum=1,
        maximum=5,
        signal="outstanding",
        target=Fraction(4),
        up_window_ms=30_000,
        down_window_ms=60_000,
        interval_ms=10_000,
    )
    return AutoscalePolicy(**(base | kw))  # type: ignore[arg-type]


def _feed(scaler: Autoscaler, values: list[int], serving: int, start: int = 0) -> int:
    t = start
    for v in values:
        scaler.observe(LoadSample(M, Fraction(v), serving), t)
        t += 10_000
    return t - 10_000


def test_a_burst_must_last_the_up_window() -> None:
    scaler = Autoscaler()
    scaler.set_policy(_policy())
    t = _feed(scaler, [4, 4, 40], serving=1)  # one sample of a burst
    assert scaler.decide(M, 1, t, 0, moving=False) is None
    t = _feed(scaler, [40, 40, 40], serving=1, start=t + 10_000)
    d = scaler.decide(M, 1, t, 0, moving=False)
    assert d is not None and d.replicas == 5  # capped at the maximum


def test_down_one_replica_at_a_time_once_a_window() -> None:
    scaler = Autoscaler()
    scaler.set_policy(_policy())
    t = _feed(scaler, [1] * 7, serving=4)
    d = scaler.decide(M, 4, t, 0, moving=False)
    assert d is not None and d.replicas == 3
    t = _feed(scaler, [1], serving=3, start=t + 10_000)
    assert scaler.decide(M, 3, t, 0, moving=False) is None  # rests a down window
    t = _feed(scaler, [1] * 6, serving=3, start=t + 10_000)
    d = scaler.decide(M, 3, t, 0, moving=False)
    assert d is not None and d.replicas == 2


def test_no_decision_while_a_replica_moves_but_bounds_hold() -> None:
    scaler = Autoscaler()
    scaler.set_policy(_policy())
    t = _feed(scaler, [1] * 7, serving=4)
    assert scaler.decide(M, 4, t, 0, moving=True) is None
    d = scaler.decide(M, 9, t, 0, moving=True)
    assert d is not None and d.replicas == 5


def test_held_requests_bring_a_model_back_from_zero_at_once() -> None:
    scaler = Autoscaler()
    scaler.set_policy(_policy(minimum=0, scale_to_zero=True))
    scaler.observe(LoadSample(M, Fraction(0), 0, held=3), 0)
    d = scaler.decide(M, 0, 0, held=3, moving=False)
    assert d is not None and d.replicas == 1


@pytest.mark.parametrize(
    ("autoscale", "message"),
    [
        ("{min: 0, max: 3, signal: outstanding, target: 4}", "min must be at least 1"),
        ("{min: 2, max: 3, signal: outstanding, target: 4}", "must be within min and max"),
        ("{min: 1, max: 3, signal: vibes, target: 4}", "is not one of outstanding"),
        ("{min: 1, max: 3, signal: kv_cache, target: 2}", "at most 1"),
        ("{min: 1, max: 3, signal: ttft_p99, target: 4}", "a ttft_p99 target is a duration"),
        ("{min: 1, max: 3, signal: outstanding, target: 4, color: red}", "color"),
    ],
)
def test_a_bad_policy_is_refused_with_its_line(autoscale: str, message: str) -> None:
    text = (
        "name: a\nduration: 1m\ncluster: {fabrics: {f: [n1]}, nodes: {default: {gpus: 1}}}\n"
        "profiles: {p: {engine: sim, gpus_per_node: 1, model: /m}}\n"
        f"deployments:\n  - {{model: m, profile: p, replicas: 1, autoscale: {autoscale}}}\n"
    )
    with pytest.raises(ScenarioError) as err:
        load_scenario_text(text, "a.yaml")
    assert err.value.line == 6 and message in err.value.message
