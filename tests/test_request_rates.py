"""The recent request rate per model that `snapshot` writes as the fleet's traffic: counted by
the forwarding over five minutes in ten-second buckets, summed over the controller and routers,
and written as a rate the scenario loader reads back to the same value."""

from __future__ import annotations

from fractions import Fraction

import pytest

from llmgw_twin.service.ops.snapshot import rate_text, rates_of
from llmgw_twin.service.router.request_metrics import RATE_BUCKET_S, RATE_BUCKETS, RecentRate
from llmgw_twin.twin.scenario.loader import load_scenario_text


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_the_rate_covers_the_last_five_minutes_only() -> None:
    clock = Clock()
    rate = RecentRate(clock)
    window = RATE_BUCKET_S * RATE_BUCKETS
    for _ in range(window):  # one request a second for the whole window
        rate.count("chat")
        clock.now += 1
    assert rate.per_second() == {"chat": pytest.approx(1.0, rel=0.05)}
    for _ in range(window // 2):  # then one every two seconds: half the window at half rate
        rate.count("chat")
        clock.now += 2
    assert rate.per_second()["chat"] == pytest.approx(0.5, rel=0.05)
    clock.now += window + RATE_BUCKET_S  # silence for longer than the window
    assert rate.per_second() == {}
    rate.count("")  # a request answered before its model was known counts for no model
    assert rate.per_second() == {}


def test_a_young_process_divides_by_its_age_not_the_window() -> None:
    clock = Clock()
    rate = RecentRate(clock)
    for _ in range(20):
        rate.count("big")
    clock.now += 10
    assert rate.per_second() == {"big": pytest.approx(2.0)}


def test_rates_are_summed_over_controller_and_routers_for_deployed_models() -> None:
    state = {
        "deployments": [{"model": "chat"}, {"model": "big"}],
        "request_rates": {"chat": 1.5, "gone": 9.0},
    }
    assert rates_of(state, [{"chat": 0.5, "big": 0.25}, {"big": 0.0}]) == {
        "chat": 2.0,
        "big": 0.25,
    }


@pytest.mark.parametrize("per_s", [250.0, 2.5, 0.25, 1 / 60, 0.0002])
def test_a_written_rate_reads_back_as_the_same_rate(per_s: float) -> None:
    text = rate_text(per_s)
    scenario = load_scenario_text(
        "name: r\nduration: 1m\ncluster: {fabrics: {f: [n1]}, nodes: {default: {gpus: 1}}}\n"
        "profiles: {p: {engine: sim, gpus_per_node: 1, model: /m}}\n"
        "deployments: [{model: m, profile: p, replicas: 1}]\n"
        f"traffic: [{{model: m, rate: {text}, tokens: 8}}]\n"
    )
    (traffic,) = scenario.traffic
    got = Fraction(traffic.count, traffic.every_ms) * 1000
    assert float(got) == pytest.approx(per_s, rel=1e-3)
