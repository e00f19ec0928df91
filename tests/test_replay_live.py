"""`llmgw-twin replay --controller URL`: the log and fleet of a live controller (on loopback,
with fake agents: `helpers.fake_fleet`) made into a scenario; the log saved with `--save-log`
replays the same from the file, and a window that opens after the fleet is ready starts from
the replicas the controller holds; a node that falls silent and is lost replays as a kill with
the same decisions (docs/live-twin.md, "Replay")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers.fake_fleet import Fleet, running_fleet
from helpers.services import free_ports, wait_sync
from llmgw_twin.cli import main
from llmgw_twin.twin.scenario.loader import load_scenario


def _ready(fleet: Fleet) -> dict[str, Any]:
    for node, fabric in (("n1", "ib-a"), ("n2", "ib-a"), ("n3", "ib-b"), ("n4", "ib-b")):
        fleet.add_node(node, fabric, 8)
    fleet.put(
        "/v1/admin/profiles/big",
        {"engine": "sim", "nodes": 2, "gpus_per_node": 4, "model": "/m/big", "load_time_ms": 1},
    )
    fleet.put("/v1/admin/deployments/big", {"profile": "big", "replicas": 2})

    def settled() -> dict[str, Any] | None:
        state = fleet.state()
        ready = [r for r in state["replicas"] if r["state"] == "ready"]
        return state if len(ready) == 2 else None

    return wait_sync(settled, 30, "two ready replicas")


def _body(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    del data["description"]  # names the source
    return data


def test_replay_of_a_live_controller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out, log, fleet_file = tmp_path / "live.yaml", tmp_path / "log.jsonl", tmp_path / "fleet.yaml"
    (tmp_path / "c").mkdir()
    with running_fleet(tmp_path / "c") as fleet:
        live = _ready(fleet)
        held = {r["replica"]: r["nodes"] for r in live["replicas"]}
        node = live["replicas"][0]["nodes"][0]
        r = fleet.client.post(f"/v1/admin/nodes/{node}/cordon")
        assert r.status_code == 200, r.text
        cordoned_at = next(e["t_ms"] for e in fleet.events() if e["kind"] == "node.cordoned")
        monkeypatch.setenv("LLMGW_TWIN_TOKEN", fleet.admin)
        url = ["--controller", fleet.url]
        assert main(["replay", *url, "-o", str(out), "--save-log", str(log)]) == 0
        assert main(["snapshot", *url, "-o", str(fleet_file)]) == 0
        window = ["--from", str(cordoned_at)]
        assert main(["replay", *url, *window, "-o", str(tmp_path / "w.yaml")]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    data = yaml.safe_load(out.read_text())
    assert fleet.admin not in out.read_text() and fleet.admin not in log.read_text()
    assert {"cordon": node} in [
        {k: v for k, v in f.items() if k == "cordon"} for f in data["faults"]
    ]
    placed = [e for e in data["expect"] if e["event"] == "replica.placed"]
    assert sorted(e["fabric"] for e in placed) == ["ib-a", "ib-b"]
    load_scenario(out)

    # the saved log and the snapshot's fleet give the same scenario
    again = tmp_path / "again.yaml"
    assert main(["replay", str(log), "--fleet", str(fleet_file), "-o", str(again)]) == 0
    assert _body(again) == _body(out)

    # a window opened at the cordon starts from the replicas the controller held
    initial = yaml.safe_load((tmp_path / "w.yaml").read_text())["initial"]
    assert {r["id"]: [s["node"] for s in r["shards"]] for r in initial["replicas"]} == held
    assert all(r["state"] == "ready" for r in initial["replicas"])


def test_replay_of_an_unreachable_controller_is_one_line_and_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LLMGW_TWIN_TOKEN", "lgw_whatever")
    (port,) = free_ports(1)
    out = tmp_path / "replay.yaml"
    assert main(["replay", "--controller", f"http://127.0.0.1:{port}", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: cannot reach the controller")
    assert list(tmp_path.iterdir()) == []


def test_a_live_incident_replays_with_the_same_decisions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "incident.yaml"
    (tmp_path / "c").mkdir()
    with running_fleet(tmp_path / "c") as fleet:
        for node, fabric in (("n1", "ib-a"), ("n2", "ib-a"), ("n3", "ib-a"), ("n4", "ib-b")):
            fleet.add_node(node, fabric, 8)
            fleet.add_node(f"{node}b", fabric, 8)
        fleet.put(
            "/v1/admin/profiles/one",
            {"engine": "sim", "gpus_per_node": 8, "model": "/m/one", "load_time_ms": 1},
        )
        fleet.put("/v1/admin/deployments/one", {"profile": "one", "replicas": 2})
        wait_sync(lambda: len(fleet.replicas("ready")) == 2 or None, 30, "two ready replicas")
        opened = fleet.events()[-1]["t_ms"] + 1
        victim = fleet.replicas("ready")[0]["nodes"][0]
        with fleet.agents.lock:
            fleet.agents.beating.discard(victim)  # it falls silent, as a node that died
        wait_sync(
            lambda: [e for e in fleet.events() if e["kind"] == "node.lost"] or None,
            30,
            "the silent node lost",
        )
        wait_sync(lambda: len(fleet.replicas("ready")) == 2 or None, 30, "a replacement ready")
        monkeypatch.setenv("LLMGW_TWIN_TOKEN", fleet.admin)
        window = ["--from", str(opened)]
        assert main(["replay", "--controller", fleet.url, *window, "-o", str(out), "--check"]) == 0
    printed = capsys.readouterr().out
    data = yaml.safe_load(out.read_text())
    assert [f.get("kill_node") for f in data["faults"]] == [victim]
    kinds = {(e["event"], e.get("node")) for e in data["expect"]}
    assert ("node.lost", victim) in kinds and ("replica.failed", victim) in kinds
    assert "check: the twin made" in printed and "not made" not in printed
