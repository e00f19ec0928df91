"""The checkers catch a broken control plane: each invariant is shown failing on a sabotaged one.

A checker that never fires proves nothing, so each test breaks one rule in the real code (with
monkeypatch) and asserts that the matching invariant reports it and the run fails.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from llmgw_twin.control.agent import AgentCore
from llmgw_twin.control.lifecycle import Lifecycle
from llmgw_twin.control.model import NodeId, Profile, TraceEvent
from llmgw_twin.control.placement import CapacityIndex, Placement, Unplaceable
from llmgw_twin.control.routing import Router
from llmgw_twin.twin.scenario.loader import load_scenario, load_scenario_text
from llmgw_twin.twin.world.runner import RunResult, run_scenario

ROOT = Path(__file__).resolve().parent.parent
NODE_LOSS = ROOT / "scenarios" / "node-loss.yaml"

ONE_NODE_PAIR = """\
name: shared-node
duration: 1m
cluster:
  fabrics:
    ib-a: [node01]
profiles:
  p: {engine: sim, nodes: 1, gpus_per_node: 4, load_time: 5s, model: /m}
deployments:
  - {model: m, profile: p, replicas: 2}
"""


def violations(result: RunResult, name: str) -> tuple[str, ...]:
    return next(i.violations for i in result.invariants if i.name == name)


def test_ready_is_whole_catches_a_replica_kept_ready_on_a_lost_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(Lifecycle, "fail", lambda self, rec, reason, node: None)
    result = run_scenario(load_scenario(NODE_LOSS))
    assert not result.passed
    found = violations(result, "ready_is_whole")
    assert found and "llama-70b-r1 ready but rank 1 is on lost node node02" in found[0]


def test_single_fabric_catches_a_replica_split_across_fabrics(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = CapacityIndex.place

    def split(
        self: CapacityIndex, profile: Profile, *args: Any, **kwargs: Any
    ) -> Placement | Unplaceable:
        got = real(self, profile, *args, **kwargs)
        if isinstance(got, Placement) and got.nodes[0] == "node01":
            return Placement(got.fabric, (NodeId("node01"), NodeId("node03")), got.gpus)
        return got

    monkeypatch.setattr(CapacityIndex, "place", split)
    result = run_scenario(load_scenario(NODE_LOSS))
    assert any("has shards in ib-a, ib-b" in v for v in violations(result, "single_fabric"))
    assert not result.passed


def test_gpu_exclusive_catches_double_booking(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CapacityIndex, "book", lambda self, node, gpus: None)
    result = run_scenario(load_scenario_text(ONE_NODE_PAIR))
    found = violations(result, "gpu_exclusive")
    assert any("booked by m-r1 and m-r2" in v for v in found)
    # the agent's own guard kept the second engine off the busy GPUs: no engine ever shared one
    assert not any("held by" in v for v in found)
    assert [e.get("replica") for e in result.trace if e.kind == "shard.started"] == ["m-r1"]


def test_routes_to_ready_catches_a_router_that_misses_failures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = Router.follow

    def only_ready(self: Router, ev: TraceEvent) -> None:
        if ev.kind == "replica.ready":
            real(self, ev)

    monkeypatch.setattr(Router, "follow", only_ready)
    result = run_scenario(load_scenario(NODE_LOSS))
    assert not result.passed
    assert any(
        "router picked llama-70b-r1, which is reaped" in v
        for v in violations(result, "routes_to_ready")
    )


def test_no_orphans_catches_an_agent_that_never_stops_anything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = AgentCore._converge

    def keep_everything(self: AgentCore, wanted: tuple, out: list) -> bool:  # type: ignore[type-arg]
        current = tuple(s.spec for s in self.shards())
        return real(self, current + tuple(w for w in wanted if w not in current), out)

    monkeypatch.setattr(AgentCore, "_converge", keep_everything)
    result = run_scenario(load_scenario(NODE_LOSS))
    assert any("node01 still runs llama-70b-r1/0" in v for v in violations(result, "no_orphans"))


def test_an_invariant_turned_off_is_reported_but_does_not_fail_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(CapacityIndex, "book", lambda self, node, gpus: None)
    text = ONE_NODE_PAIR + "invariants:\n  off: {gpu_exclusive: studying double booking}\n"
    result = run_scenario(load_scenario_text(text))
    inv = next(i for i in result.invariants if i.name == "gpu_exclusive")
    assert not inv.enabled and inv.off_reason == "studying double booking" and inv.violations
    assert result.passed
