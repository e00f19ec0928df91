"""The twin of the live fleet, checked on real processes (docs/live-twin.md, "Checked for real").

A real-mode cluster (a controller and agents on loopback, sim engines as subprocesses, every
duration scaled by 0.1) runs its deployments; beside the run, once every replica serves, the
test snapshots the live controller and:

- runs the twin from the snapshot: it adopts every replica and does nothing else;
- asks `what-if` what a drain of a node does, then drains that node for real, and compares:
  the same replicas moved to the same copies on the same fabric, and the drain done within the
  real mode's tolerance of the predicted time;
- asks `what-if` what a fabric outage the scenario holds does, before it happens, and compares
  with what the real cluster then did.

The snapshot is of the scaled cluster (its timings and load times are the scaled ones), so the
twin's predicted times are in the real run's milliseconds.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from helpers.real_runs import alive_groups
from llmgw_twin.live import whatif
from llmgw_twin.live.whatif_actions import Action
from llmgw_twin.live.whatif_outcome import Outcome
from llmgw_twin.realmode.cluster import RealCluster
from llmgw_twin.realmode.report import decisions
from llmgw_twin.realmode.runner import run_real
from llmgw_twin.service.ops.snapshot import fetch_state, scenario_text
from llmgw_twin.twin.report import capacity
from llmgw_twin.twin.scenario.loader import load_scenario, load_scenario_text
from llmgw_twin.twin.world.runner import RunResult, run_scenario

SCALE = 0.1
TOLERANCE_MS = 2_000
"""Real mode's fidelity tolerance (docs/real-mode.md), in the run's (scaled) milliseconds."""
WAIT_S = 60.0

FLEET = """\
name: live-fleet
seed: 1
duration: {duration}
cluster:
  fabrics: {{ib-a: [node01, node02, node03], ib-b: [node04, node05]}}
  nodes:
    default: {{gpus: 8, engines: [sim]}}
profiles:
  big: {{engine: sim, nodes: 2, gpus_per_node: 4, load_time: 20s, model: /m/big}}
  small: {{engine: sim, gpus_per_node: 2, load_time: 10s, model: /m/small}}
deployments:
  - {{model: big, profile: big, replicas: 2}}
  - {{model: small, profile: small, replicas: 2}}
{faults}
"""


@pytest.fixture
def own_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def _poll(read: Callable[[], Any], what: str, within_s: float = WAIT_S) -> Any:
    """`read()` until it gives something other than None, a bounded number of times."""
    import time

    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        got = read()
        if got is not None:
            return got
        time.sleep(0.05)
    raise AssertionError(f"not within {within_s:.0f}s: {what}")


def _snapshot(cluster: RealCluster, folder: Path) -> Path:
    token = cluster.admin_headers["authorization"].removeprefix("Bearer ")
    (folder / "token").write_text(token)
    args = argparse.Namespace(
        controller=cluster.controller_url,
        token_file=folder / "token",
        ca=None,
        cert=None,
        key=None,
    )
    path = folder / "fleet.yaml"
    path.write_text(scenario_text(fetch_state(args), "live", 600_000, 1, "the live cluster"))
    return path


def _all_ready(cluster: RealCluster) -> dict[str, Any] | None:
    r = httpx.get(f"{cluster.controller_url}/v1/admin/state", headers=cluster.admin_headers)
    state: dict[str, Any] = r.json()
    ready = [x for x in state["replicas"] if x["state"] == "ready"]
    return state if len(ready) == 4 and len(state["replicas"]) == 4 else None


def _rehearse(fleet: Path, action: Action, at_ms: int, watch_ms: int) -> tuple[RunResult, Outcome]:
    args = argparse.Namespace(
        snapshot=fleet,
        controller=None,
        actions=[action],
        at=f"{at_ms}ms",
        watch=f"{watch_ms}ms",
        seeds=1,
        rate=[],
    )
    scenario, at, _ = whatif.prepare(args)
    result = run_scenario(scenario)
    return result, Outcome.of(result, at)


def _side_by_side(
    title: str,
    twin: dict[str, list[Any]],
    real: dict[str, list[Any]],
    rows: list[tuple[str, int | None, int | None]],
) -> None:
    """What was predicted beside what happened, for people (`pytest -s` shows it)."""
    print(f"\n{title}")
    print(f"  {'':<28} {'what-if':>10} {'real':>10}")
    for name, predicted, happened in rows:
        shown = [f"+{v / 1000:.3f}s" if v is not None else "never" for v in (predicted, happened)]
        print(f"  {name:<28} {shown[0]:>10} {shown[1]:>10}")
    for key in sorted(set(twin) | set(real)):
        same = "same" if twin.get(key) == real.get(key) else "DIFFERS"
        print(f"  {key:<14} {same}: {real.get(key)}")


def _after(trace: Any, t_ms: int) -> dict[str, list[Any]]:
    """The decisions made from `t_ms` on, with the adoption the twin starts with left out."""
    later = [ev for ev in trace if ev.t_ms >= t_ms]
    return {k: v for k, v in decisions(later).items() if v}


def test_a_snapshot_of_a_real_cluster_runs_idle_and_a_drain_goes_as_predicted(
    own_tmp: Path,
) -> None:
    seen: dict[str, Any] = {}

    def operator(cluster: RealCluster, now_ms: Callable[[], int]) -> None:
        state = _poll(lambda: _all_ready(cluster), "four ready replicas")
        fleet = _snapshot(cluster, own_tmp)
        seen["idle"] = run_scenario(load_scenario(fleet))
        big = sorted(
            (r for r in state["replicas"] if r["model"] == "big"), key=lambda r: r["replica"]
        )
        node = big[0]["nodes"][0]
        at_ms = 3_000
        seen["node"] = node
        seen["twin"], seen["predicted"] = _rehearse(fleet, Action("drain", node), at_ms, 20_000)
        seen["twin_at"] = at_ms
        seen["drain_at"] = now_ms()
        url = f"{cluster.controller_url}/v1/admin/nodes/{node}/drain"
        assert httpx.post(url, headers=cluster.admin_headers).status_code == 200

        def drained() -> bool | None:
            answer = httpx.get(url, headers=cluster.admin_headers).json()
            return True if answer.get("drained") else None

        _poll(drained, f"{node} drained")

    scenario = load_scenario_text(FLEET.format(duration="5m", faults=""), "live-fleet.yaml")
    real = run_real(scenario, SCALE, TOLERANCE_MS, alongside=operator)
    assert real.left_running == [] and alive_groups(real.groups) == set()

    idle: RunResult = seen["idle"]
    kinds = [e.kind for e in idle.trace]
    assert kinds.count("replica.adopted") == 4 and idle.engine_starts == 0
    assert not {"replica.placed", "replica.failed", "replica.reaped", "shard.started"} & set(kinds)

    node = seen["node"]
    twin_moves = _after(seen["twin"].trace, seen["twin_at"])
    real_moves = _after(real.trace, seen["drain_at"])
    assert twin_moves and twin_moves == real_moves, (twin_moves, real_moves)
    predicted: Outcome = seen["predicted"]
    ((drained_node, predicted_ms),) = predicted.drains
    assert drained_node == node and predicted_ms is not None
    real_drained = next(e.t_ms for e in real.trace if e.kind == "node.drained")
    real_ms = real_drained - seen["drain_at"]
    _side_by_side(
        f"drain of {node}", twin_moves, real_moves, [("drained after", predicted_ms, real_ms)]
    )
    assert abs(real_ms - predicted_ms) <= TOLERANCE_MS


def test_a_fabric_outage_on_a_real_cluster_goes_as_predicted(own_tmp: Path) -> None:
    seen: dict[str, Any] = {}
    outage_at_ms, outage_ms = 12_000, 6_000  # in the run's scaled time: 2m and 1m in the file

    def operator(cluster: RealCluster, now_ms: Callable[[], int]) -> None:
        _poll(lambda: _all_ready(cluster), "four ready replicas")
        fleet = _snapshot(cluster, own_tmp)
        snapped = now_ms()
        assert snapped < outage_at_ms - 2_000, "the cluster took too long to be ready"
        # the twin starts at the snapshot: the outage comes `outage_at - snapped` later
        at_ms = outage_at_ms - snapped
        action = Action("fabric-down", "ib-a", f"{outage_ms}ms")
        seen["twin"], seen["predicted"] = _rehearse(fleet, action, at_ms, 15_000)
        seen["twin_at"] = at_ms

    faults = "faults:\n  - {id: out, at: 2m, fabric_down: {fabric: ib-a, for: 1m}}"
    text = FLEET.format(duration="5m", faults=faults)
    scenario = load_scenario_text(text, "live-outage.yaml")
    real = run_real(scenario, SCALE, TOLERANCE_MS, alongside=operator)
    assert real.left_running == [] and alive_groups(real.groups) == set()

    twin: RunResult = seen["twin"]
    twin_after = _after(twin.trace, seen["twin_at"])
    real_after = _after(real.trace, outage_at_ms)
    assert twin_after and twin_after == real_after, (twin_after, real_after)
    predicted: Outcome = seen["predicted"]
    want = capacity.wanted(real.scenario)
    serve = capacity.serving(tuple(real.trace), list(want))
    real_whole = capacity.whole_again(serve, want, outage_at_ms, real.scenario.duration_ms)
    assert predicted.whole_after_ms is not None and real_whole is not None
    (big,) = [s for s in predicted.short if s.model == "big"]
    real_big = capacity.shortfall(
        serve["big"], want["big"], outage_at_ms, real.scenario.duration_ms, "big"
    )
    _side_by_side(
        "ib-a down for 6s (1m in the file)",
        twin_after,
        real_after,
        [
            ("every model whole again", predicted.whole_after_ms, real_whole - outage_at_ms),
            ("big short of its count for", big.short_ms, real_big.short_ms),
        ],
    )
    assert big.least == real_big.least
    assert abs((real_whole - outage_at_ms) - predicted.whole_after_ms) <= TOLERANCE_MS


def test_an_incident_on_a_real_cluster_replays_in_the_twin_with_its_decisions(
    own_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A node powered off and an engine killed on the real cluster; from the live controller's
    own event log, `replay` writes the incident as a scenario whose twin run makes every
    decision the real controller logged (`--check`)."""
    seen: dict[str, Any] = {}
    out = own_tmp / "incident.yaml"

    def operator(cluster: RealCluster, now_ms: Callable[[], int]) -> None:
        token = cluster.admin_headers["authorization"].removeprefix("Bearer ")
        (own_tmp / "token").write_text(token)
        # the window opens once every replica serves, before the incident (at 6 s): the
        # deployments' first placement waits on the agents' start-up, which the log does not
        # show, so a window from the log's start would time it from the controller's start
        _poll(lambda: _all_ready(cluster), "four ready replicas")
        r = httpx.get(f"{cluster.controller_url}/v1/admin/events", headers=cluster.admin_headers)
        opened = max(ev["t_ms"] for ev in r.json()["events"]) + 1
        seen["opened_at"] = now_ms()

        def settled() -> bool | None:  # both faults done, and the fleet whole again
            return True if now_ms() >= 22_000 else None

        _poll(settled, "the incident to settle")
        argv = ["replay", "--controller", cluster.controller_url, "--token-file"]
        argv += [str(own_tmp / "token"), "-o", str(out), "--check", "--from", str(opened)]
        from llmgw_twin.cli import main

        seen["code"] = main(argv)

    faults = (
        "faults:\n  - {id: kill, at: 1m, kill_node: node02}\n"
        "  - {id: crash, at: 2m, kill_engine: {node: node04, replica_of: small}}"
    )
    scenario = load_scenario_text(FLEET.format(duration="4m", faults=faults), "incident.yaml")
    real = run_real(scenario, SCALE, TOLERANCE_MS, alongside=operator)
    assert real.left_running == [] and alive_groups(real.groups) == set()
    printed = capsys.readouterr()
    assert seen["opened_at"] < 6_000, "the cluster took too long to be ready"
    assert seen["code"] == 0, printed.out + printed.err
    data = yaml.safe_load(out.read_text())
    kinds = {(f.get("kill_node"), "kill_engine" in f) for f in data["faults"]}
    assert ("node02", False) in kinds and any(engine for _, engine in kinds), data["faults"]
    pinned = [e for e in data["expect"] if e.get("event") == "node.lost"]
    assert [e["node"] for e in pinned] == ["node02"]
    real_failed = sorted(
        (str(e.get("model")), str(e.get("node"))) for e in real.trace if e.kind == "replica.failed"
    )
    replayed = sorted(
        (e["model"], e["node"]) for e in data["expect"] if e.get("event") == "replica.failed"
    )
    assert real_failed == [("big", "node02"), ("small", "node04")] and replayed == real_failed
