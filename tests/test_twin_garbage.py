"""A twin run makes no cyclic garbage as it goes: `run_scenario` pauses the cycle collector for
the run (it walked the whole world again and again, a third of a 10,000-node hour), which is
sound only while the run does not keep making objects that only that collector frees. A timer
that was a closure naming itself made one such cycle per timer, once a virtual second."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from llmgw_twin.twin.scenario.loader import load_scenario
from llmgw_twin.twin.scenario.model import Scenario
from llmgw_twin.twin.world import runner
from llmgw_twin.twin.world.sim import World

ROOT = Path(__file__).resolve().parent.parent
PARTS = 8


@pytest.mark.parametrize(
    "name",
    [
        "node-loss",  # a fleet's start, a node lost, a replacement
        "node-loss-traffic",  # requests routed all the while
        "controller-stall-failover",  # a stalled leader, a takeover, timers held and fired
        "controller-clock-skew",  # a skewed process clock's timers
        "autoscale-diurnal",  # the autoscaler and a day's traffic shape
    ],
)
def test_a_run_makes_no_cyclic_garbage_as_it_goes(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The collector, run by hand at each eighth of the run (the world alive), finds next to
    nothing past the first (which holds the loading's and the fleet's start)."""
    found: list[int] = []
    run = runner._run

    def spied(*args: object) -> runner.RunResult:
        scenario, _seed, _env, world = args[:4]
        assert isinstance(scenario, Scenario) and isinstance(world, World)
        for part in range(1, PARTS + 1):
            at = scenario.duration_ms * part // PARTS - 1
            world.later(at, lambda: found.append(gc.collect()))
        return run(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(runner, "_run", spied)
    gc.collect()
    result = runner.run_scenario(load_scenario(ROOT / "scenarios" / f"{name}.yaml"))
    assert result.passed
    assert len(found) == PARTS
    # a takeover or a replacement may leave a few; one per timer or request would be hundreds
    assert max(found[1:]) <= 100, found


def test_the_collector_is_paused_for_a_run_and_back_after_one_that_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*_args: object) -> None:
        assert not gc.isenabled()  # paused while the run goes on
        raise RuntimeError("the run broke")

    monkeypatch.setattr(runner, "_run", broken)
    scenario = load_scenario(ROOT / "scenarios" / "node-loss.yaml")
    assert gc.isenabled()
    with pytest.raises(RuntimeError, match="the run broke"):
        runner.run_scenario(scenario)
    assert gc.isenabled()
