"""`llmgw-twin what-if` and `ctl ... --dry-run`: actions rehearsed in the twin on a snapshot of the
fleet, or on a live controller's fleet, with the predicted outcome (docs/live-twin.md).

The fleet is a snapshot's shape (an `initial` section): two fabrics, a two-node model and a
one-node one, a cordoned node with a failed GPU. What is asserted is what the twin's control
core then decides: a drain moves what can move and leaves the rest with the controller's reason;
a fabric outage fails the replicas on it and they come back when it does; a scale beyond the
fleet leaves replicas unplaceable. Bad input is one line, exit 2 and no file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers.fake_fleet import running_fleet
from helpers.services import wait_sync
from llmgw_twin.cli import main
from llmgw_twin.twin.report import capacity
from llmgw_twin.twin.scenario.loader import load_scenario
from llmgw_twin.twin.world.runner import run_scenario

FLEET = """\
name: fleet
seed: 3
duration: 10m
cluster:
  fabrics: {ib-a: [node01, node02, node03], ib-b: [node04, node05]}
  nodes:
    default: {gpus: 8, engines: [sim]}
profiles:
  big: {engine: sim, nodes: 2, gpus_per_node: 4, load_time: 20s, model: /m/big}
  small: {engine: sim, gpus_per_node: 2, load_time: 5s, model: /m/small}
deployments:
  - {model: big, profile: big, replicas: 2}
  - {model: small, profile: small, replicas: 2}
traffic:
  - {model: big, rate: 2/s, tokens: 16}
initial:
  nodes:
    node05: {failed_gpus: [7], cordoned: true}
  replicas:
    - id: big-r1
      model: big
      profile: big
      state: ready
      shards:
        - {rank: 0, node: node01, gpus: [0, 1, 2, 3]}
        - {rank: 1, node: node02, gpus: [0, 1, 2, 3]}
    - id: big-r2
      model: big
      profile: big
      state: ready
      shards:
        - {rank: 0, node: node04, gpus: [0, 1, 2, 3]}
        - {rank: 1, node: node05, gpus: [0, 1, 2, 3]}
    - id: small-r1
      model: small
      profile: small
      state: ready
      shards: [{rank: 0, node: node01, gpus: [4, 5]}]
    - id: small-r2
      model: small
      profile: small
      state: ready
      shards: [{rank: 0, node: node04, gpus: [4, 5]}]
"""


@pytest.fixture
def fleet_file(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET)
    return path


def _what_if(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(["what-if", *argv, "--json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def test_a_drain_moves_what_fits_and_names_what_does_not(
    fleet_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    got = _what_if(capsys, "--snapshot", str(fleet_file), "--drain", "node01", "--seeds", "2")
    assert [s["seed"] for s in got["seeds"]] == [3, 4]
    for seed in got["seeds"]:
        # both replicas on node01 get a copy (big-r1's on node02 and node03, the only two
        # nodes with four free GPUs; small-r1's beside it) and stop once it serves: nothing
        # fails, no model is ever short
        assert seed["replicas_failed"] == 0
        assert seed["replicas_moved"] == 2 and seed["replicas_placed"] == 2
        ((node, took),) = [(d["node"], d["drained_after_ms"]) for d in seed["drains"]]
        assert node == "node01" and took is not None and took >= 20_000  # big loads for 20s
        assert seed["whole_again_after_ms"] == 0
        assert seed["requests"]["big"]["failed"] == 0 and seed["requests"]["big"]["sent"] > 0
        assert seed["unplaceable"] == []


def test_a_drain_with_no_room_is_reported_unfinished_with_the_reason(
    fleet_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # with node01 and node03 drained, big-r1 (node01, node02) needs two nodes with four free
    # GPUs in one fabric: ib-a has node02 only, ib-b's node04 has two and node05 is cordoned
    argv = ["--snapshot", str(fleet_file), "--drain", "node01", "--drain", "node03"]
    got = _what_if(capsys, *argv, "--seeds", "1")
    (seed,) = got["seeds"]
    assert seed["drains"] == [
        {"node": "node01", "drained_after_ms": None},
        {"node": "node03", "drained_after_ms": 0},
    ]
    (stuck,) = seed["unplaceable"]
    assert stuck["model"] == "big" and "in one fabric" in stuck["reason"]
    assert seed["replicas_failed"] == 0  # make-before-break: the original keeps serving


def test_a_fabric_outage_fails_its_replicas_until_it_is_back(
    fleet_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    got = _what_if(
        capsys, "--snapshot", str(fleet_file), "--fabric-down", "ib-a=3m", "--watch", "15m"
    )
    for seed in got["seeds"]:
        assert seed["replicas_failed"] >= 1
        big = seed["models"]["big"]
        assert big["least_serving"] < 2 and big["short_ms"] > 0
        # whole again after the fabric is back, not before
        assert seed["whole_again_after_ms"] is not None
        assert seed["whole_again_after_ms"] > 3 * 60_000
        # big-r2 on ib-b serves throughout: the router sends every request there
        assert seed["requests"]["big"]["sent"] > 0 and seed["requests"]["big"]["failed"] == 0


def test_the_text_report_shows_the_capacity_dip_and_what_stays_unplaceable(
    fleet_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["what-if", "--snapshot", str(fleet_file), "--scale", "big=6", "--seeds", "1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "scale big=6 at +30s" in out
    line = next(x for x in out.splitlines() if x.strip().startswith("big "))
    assert "short of its count" in line  # the fleet has room for 4 at most
    assert "unplaceable at the end" in out and "big: 2," in out


def test_the_scenario_it_ran_runs_again_with_the_same_trace(
    fleet_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rehearsed.yaml"
    got = _what_if(
        capsys,
        "--snapshot",
        str(fleet_file),
        "--lose-node",
        "node02",
        "-o",
        str(out),
        "--seeds",
        "1",
    )
    data = yaml.safe_load(out.read_text())
    assert data["faults"] == [{"id": "whatif1", "at": "30s", "kill_node": "node02"}]
    again = run_scenario(load_scenario(out), 3)
    assert again.trace_sha256 == got["seeds"][0]["trace_sha256"]
    assert got == _what_if(
        capsys, "--snapshot", str(fleet_file), "--lose-node", "node02", "--seeds", "1"
    )


@pytest.mark.parametrize(
    ("action", "message"),
    [
        (["--drain", "node09"], "node 'node09': the fleet has no such node"),
        (["--fabric-down", "ib-z=5m"], "fabric 'ib-z': the fleet has no such fabric"),
        (["--scale", "nope=3"], "model 'nope': the fleet has no such model"),
        (["--set-profile", "big=huge"], "profile 'huge': the fleet has no such profile"),
        (["--fail-gpu", "node01:8"], "the node has GPUs 0 to 7"),
        (["--node-down", "node01=soon"], "--node-down node01=soon"),
        ([], "no action given"),
    ],
)
def test_bad_actions_are_one_line_and_write_nothing(
    fleet_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    action: list[str],
    message: str,
) -> None:
    out = tmp_path / "out.yaml"
    assert main(["what-if", "--snapshot", str(fleet_file), *action, "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]
    assert not out.exists()


def test_a_snapshot_that_does_not_load_is_named_with_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(FLEET.replace("state: ready", "state: asleep", 1))
    assert main(["what-if", "--snapshot", str(bad), "--drain", "node01"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {bad}:") and "asleep" in err


def test_dry_run_on_a_live_controller_predicts_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with running_fleet(tmp_path) as fleet:
        for node, fabric in (("n1", "ib-a"), ("n2", "ib-a"), ("n3", "ib-b")):
            fleet.add_node(node, fabric, 8)
        fleet.put(
            "/v1/admin/profiles/small",
            {"engine": "sim", "gpus_per_node": 2, "model": "/m/small", "load_time_ms": 5_000},
        )
        fleet.put("/v1/admin/deployments/small", {"profile": "small", "replicas": 2})

        def ready() -> bool | None:
            return sum(r["state"] == "ready" for r in fleet.state()["replicas"]) == 2 or None

        wait_sync(ready, 30, "two ready replicas")
        monkeypatch.setenv("LLMGW_TWIN_TOKEN", fleet.admin)
        node = fleet.state()["replicas"][0]["nodes"][0]
        before = fleet.state()
        argv = ["ctl", "drain", node, "--controller", fleet.url, "--dry-run", "--seeds", "1"]
        assert main(argv) == 0
        out = capsys.readouterr().out
        assert f"drain {node} at +30s" in out and f"drain of {node}: done by" in out
        after = fleet.state()
        assert [n["cordoned"] for n in after["nodes"]] == [n["cordoned"] for n in before["nodes"]]
        assert sorted(r["replica"] for r in after["replicas"]) == sorted(
            r["replica"] for r in before["replicas"]
        )
        argv = ["ctl", "deployment", "set", "small", "--replicas", "9", "--dry-run"]
        assert main([*argv, "--controller", fleet.url, "--seeds", "1"]) == 0
        assert "unplaceable at the end" in capsys.readouterr().out
        assert {d["model"]: d["replicas"] for d in fleet.state()["deployments"]} == {"small": 2}
        # without --dry-run, the change is made
        assert (
            main(
                ["ctl", "deployment", "set", "small", "--replicas", "1", "--controller", fleet.url]
            )
            == 0
        )
        assert {d["model"]: d["replicas"] for d in fleet.state()["deployments"]} == {"small": 1}


def test_capacity_series_follow_the_router_events() -> None:
    result = run_scenario(load_scenario("scenarios/node-loss.yaml"))
    want = capacity.wanted(result.scenario)
    serve = capacity.serving(result.trace, list(want))
    for model, series in serve.items():
        times = [t for t, _ in series]
        assert times == sorted(set(times)) and times[0] == 0
        assert all(c >= 0 for _, c in series)
        assert capacity.at(series, result.virtual_ms) == capacity.at(want[model], 0)
    kill = next(f.at_ms for f in result.scenario.faults)
    whole = capacity.whole_again(serve, want, kill, result.virtual_ms)
    assert whole is not None and whole > kill
    line = capacity.sparkline(serve[next(iter(serve))], want[next(iter(want))], 0, 60_000, 12)
    assert len(line) == 12 and set(line) <= set(capacity.BARS)


def test_an_unreachable_controller_is_one_line_and_runs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from helpers.services import free_ports

    monkeypatch.setenv("LLMGW_TWIN_TOKEN", "lgw_whatever")
    (port,) = free_ports(1)
    out = tmp_path / "rehearsed.yaml"
    argv = ["what-if", "--controller", f"http://127.0.0.1:{port}", "--drain", "n1", "-o", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: cannot reach the controller")
    assert not out.exists()


def test_a_refused_credential_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with running_fleet(tmp_path) as fleet:
        fleet.add_node("n1", "ib-a", 8)
        monkeypatch.setenv("LLMGW_TWIN_TOKEN", "lgw_not-a-token-of-this-controller")
        assert main(["what-if", "--controller", fleet.url, "--drain", "n1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "refused the credential (401)" in err[0]
