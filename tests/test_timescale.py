"""Scaling a scenario's clock, and widening its windows for wall-clock runs."""

from __future__ import annotations

from pathlib import Path

from llmgw_twin.twin.scenario.loader import load_scenario
from llmgw_twin.twin.scenario.model import EventExpectation, StateExpectation
from llmgw_twin.twin.scenario.timescale import scale_scenario, widen
from llmgw_twin.twin.world.runner import run_scenario

ROOT = Path(__file__).resolve().parent.parent


def test_every_duration_is_scaled() -> None:
    s = load_scenario(ROOT / "scenarios" / "node-loss.yaml")
    fast = scale_scenario(s, 0.1)
    assert fast.duration_ms == 36_000
    assert (fast.timings.heartbeat_interval_ms, fast.timings.node_lost_after_ms) == (1_000, 6_000)
    assert fast.timings.reconcile_interval_ms == 100
    assert fast.profiles[0].load_time_ms == 2_000
    assert fast.faults[0].at_ms == 12_000
    lost = fast.expectations[0]
    assert isinstance(lost, EventExpectation)
    assert (lost.start_ms, lost.end_ms) == (17_000, 18_100)


def test_the_scaled_story_still_holds_in_the_twin() -> None:
    for name in ("node-loss", "controller-restart-healthy", "partition"):
        s = load_scenario(ROOT / "scenarios" / f"{name}.yaml")
        result = run_scenario(scale_scenario(s, 0.1))
        assert result.passed, name


def test_widen_pads_windows_narrows_never_and_delays_state_checks() -> None:
    s = scale_scenario(load_scenario(ROOT / "scenarios" / "node-loss.yaml"), 0.1)
    wide = widen(s, 1_500)
    lost, ready, never, end = wide.expectations
    assert isinstance(lost, EventExpectation) and (lost.start_ms, lost.end_ms) == (15_500, 19_600)
    assert isinstance(never, EventExpectation) and never.never
    assert (never.start_ms, never.end_ms) == (13_500, 34_500)
    assert isinstance(end, StateExpectation) and end.at_ms == 36_000  # clamped to the end
    assert isinstance(ready, EventExpectation) and ready.end_ms == 21_700
