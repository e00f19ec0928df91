"""Bulk heartbeats (twin/world/heartbeats.py) give exactly what one event per heartbeat gives.

Every scenario file and `FUZZ_SEEDS` fuzzed fleets (the fuzzer's own generator) run both ways;
the traces are compared byte for byte (canonical JSON, line by line), and so are every
expectation's outcome, every invariant's violations, and when each engine started. (How many
times an invariant was checked is not compared, only that it was: a reconcile with nothing to do
is skipped (`control/wake.py`), and a core that hears every heartbeat knows its nodes' silence
deadlines where one whose quiet nodes coast does not, so the two wake for different numbers of
idle reconciles, each of which changes nothing.)
The runs must also have coasted: a comparison where no node ever coasted proves nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw_twin.control.health import HealthTracker
from llmgw_twin.control.model import NodeId, NodeState, Timings
from llmgw_twin.twin.fuzz.gen import generate, scenario_text
from llmgw_twin.twin.scenario.loader import load_scenario, load_scenario_text
from llmgw_twin.twin.scenario.model import Scenario
from llmgw_twin.twin.world import heartbeats
from llmgw_twin.twin.world.runner import RunResult, canonical_event, run_scenario

ROOT = Path(__file__).resolve().parent.parent
FILES = sorted([*ROOT.glob("scenarios/*.yaml"), *ROOT.glob("scenarios/regressions/*.yaml")])
FUZZ_SEEDS = range(60)


def _outcome(result: RunResult) -> tuple[object, ...]:
    return (
        "\n".join(canonical_event(ev) for ev in result.trace),
        result.expectations,
        [(i.name, i.enabled, i.off_reason, i.violations, i.checks > 0) for i in result.invariants],
        result.engine_starts,
        result.engine_starts_by_ms,
        result.passed,
    )


def _both(scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> int:
    """Assert both modes agree; returns how many times a node started coasting."""
    coasts = [0]
    enter = heartbeats.Heartbeats._maybe_coast

    def counted(self: heartbeats.Heartbeats, node: object, msg: object) -> None:
        before = len(self.coasting)
        enter(self, node, msg)  # type: ignore[arg-type]
        coasts[0] += len(self.coasting) - before

    monkeypatch.setattr(heartbeats.Heartbeats, "_maybe_coast", counted)
    each = run_scenario(scenario, bulk=False)
    assert coasts[0] == 0
    bulk = run_scenario(scenario, bulk=True)
    assert _outcome(bulk) == _outcome(each)
    return coasts[0]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_scenario_file_gives_the_same_run_in_bulk(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _both(load_scenario(path), monkeypatch)


def test_fuzzed_fleets_give_the_same_run_in_bulk(monkeypatch: pytest.MonkeyPatch) -> None:
    coasted = 0
    for seed in FUZZ_SEEDS:
        plan = generate(seed)
        coasted += _both(load_scenario_text(scenario_text(plan), f"fuzz-{seed}.yaml"), monkeypatch)
    assert coasted > len(FUZZ_SEEDS)  # nodes did coast, and were landed by faults


def test_a_scenario_file_coasts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The files' nodes coast too: the comparison above means something for them."""
    assert _both(load_scenario(ROOT / "scenarios" / "node-loss.yaml"), monkeypatch) > 0


def test_a_landed_node_takes_its_place_by_last_heartbeat() -> None:
    health = HealthTracker(Timings())
    for i, node in enumerate(["a", "b", "c", "d"]):
        health.seen(NodeId(node), 1_000 * i)
    health.coast(NodeId("a"))
    assert health.state(NodeId("a")) is NodeState.ALIVE
    assert health.alive_count == 4
    health.land(NodeId("a"), 1_500)  # heard after b, before c
    changes = health.expire_suspect(1_500 + Timings().node_suspect_after_ms)
    assert [c.node for c in changes] == ["b", "a"]


def test_nodes_silent_since_the_same_millisecond_turn_suspect_in_name_order() -> None:
    health = HealthTracker(Timings())
    for node in ["c", "a", "b"]:
        health.seen(NodeId(node), 7)
    changes = health.expire_suspect(7 + Timings().node_suspect_after_ms)
    assert [c.node for c in changes] == ["a", "b", "c"]
    lost = health.expire_lost(7 + Timings().node_lost_after_ms)
    assert [c.node for c in lost] == ["a", "b", "c"]
