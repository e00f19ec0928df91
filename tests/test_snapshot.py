"""`llmgw-twin snapshot`: a live controller's fleet as a scenario file with an `initial` section,
and the twin started in exactly that state (docs/live-twin.md).

The round trip runs against a controller on loopback with fake agents (`helpers.fake_fleet`):
its replicas, failed GPU, cordon and drain come back in the file, no secret does, and the twin's
run from the file adopts every replica ready with no placement, restart or failure. The loader
refuses a bad `initial` section with file, line and reason; a controller that cannot be reached
or refuses the credential is one line and exit 2, with no file written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers.fake_fleet import Fleet, running_fleet
from helpers.services import free_ports, wait_sync
from llmgw_twin.cli import main
from llmgw_twin.twin.scenario.loader import ScenarioError, load_scenario, load_scenario_text
from llmgw_twin.twin.world.runner import RunResult, run_scenario

SECRET = "sk-live-do-not-write-me"  # noqa: S105  (an engine flag the file must not carry)


def _ready_fleet(fleet: Fleet) -> dict[str, Any]:
    for node, fabric in (("n1", "ib-a"), ("n2", "ib-a"), ("n3", "ib-b"), ("n4", "ib-b")):
        fleet.add_node(node, fabric, 8, failed=(7,) if node == "n4" else ())
    fleet.put(
        "/v1/admin/profiles/big",
        {
            "engine": "sim",
            "nodes": 2,
            "gpus_per_node": 4,
            "model": "/m/big",
            "load_time_ms": 20_000,
            "args": ["--api-key", SECRET, "--ctx-size", "4096"],
        },
    )
    fleet.put(
        "/v1/admin/profiles/small",
        {"engine": "sim", "gpus_per_node": 2, "model": "/m/small", "load_time_ms": 5_000},
    )
    fleet.put("/v1/admin/deployments/big", {"profile": "big", "replicas": 2})
    fleet.put("/v1/admin/deployments/small", {"profile": "small", "replicas": 2})

    def settled() -> dict[str, Any] | None:
        state = fleet.state()
        ready = [r for r in state["replicas"] if r["state"] == "ready"]
        return state if len(ready) == 4 and len(state["replicas"]) == 4 else None

    wait_sync(settled, 30, "four ready replicas")
    # a cordon on a node that still holds a replica: kept, nothing moves
    holding = sorted({n for r in fleet.state()["replicas"] for n in r["nodes"]})
    r = fleet.client.post(f"/v1/admin/nodes/{holding[0]}/cordon")
    assert r.status_code == 200, r.text
    return fleet.state()


def _events(result: RunResult, kind: str) -> list[dict[str, Any]]:
    return [e.as_dict() for e in result.trace if e.kind == kind]


def test_snapshot_round_trip_starts_the_twin_idle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "fleet.yaml"
    with running_fleet(tmp_path) as fleet:
        live = _ready_fleet(fleet)
        monkeypatch.setenv("LLMGW_TWIN_TOKEN", fleet.admin)
        assert main(["snapshot", "--controller", fleet.url, "-o", str(out)]) == 0
        node_tokens = [t for _, _, t in fleet.agents.nodes.values()]
    assert f"wrote {out}" in capsys.readouterr().out
    text = out.read_text()
    for secret in (SECRET, fleet.admin, *node_tokens):
        assert secret not in text
    assert "REDACTED" in text

    data = yaml.safe_load(text)
    assert data["cluster"]["fabrics"] == {"ib-a": ["n1", "n2"], "ib-b": ["n3", "n4"]}
    assert data["initial"]["nodes"]["n4"]["failed_gpus"] == [7]
    cordoned = [n for n, v in data["initial"]["nodes"].items() if v.get("cordoned")]
    assert cordoned == [n["node"] for n in live["nodes"] if n["cordoned"]]
    by_id = {r["id"]: r for r in data["initial"]["replicas"]}
    assert sorted(by_id) == sorted(r["replica"] for r in live["replicas"])
    for r in live["replicas"]:
        got = by_id[r["replica"]]
        assert got["state"] == "ready" and got["fabric"] == r["fabric"]
        assert [(s["rank"], s["node"], s["gpus"]) for s in got["shards"]] == [
            (s["rank"], s["node"], s["gpus"]) for s in r["shards"]
        ]

    scenario = load_scenario(out)
    assert scenario.initial is not None and len(scenario.initial.placed()) == 4
    result = run_scenario(scenario)
    assert result.passed
    for kind in ("replica.placed", "replica.failed", "replica.reaped", "shard.started"):
        assert _events(result, kind) == [], kind
    adopted = _events(result, "replica.adopted")
    assert sorted(e["replica"] for e in adopted) == sorted(by_id)
    assert all(e["ready"] for e in adopted)
    assert result.engine_starts == 0
    # determinism: the same file and seed, the same trace
    assert run_scenario(load_scenario(out)).trace_sha256 == result.trace_sha256


def test_snapshot_of_a_draining_node_carries_on_with_the_drain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "fleet.yaml"
    with running_fleet(tmp_path) as fleet:
        _ready_fleet(fleet)
        monkeypatch.setenv("LLMGW_TWIN_TOKEN", fleet.admin)
        node = fleet.state()["replicas"][0]["nodes"][0]
        # the fake agents report the drain's copies ready only after a heartbeat or two: the
        # drain is under way when snapped (whatever of it is done, the rest is to do)
        r = fleet.client.post(f"/v1/admin/nodes/{node}/drain")
        assert r.status_code == 200, r.text
        assert main(["snapshot", "--controller", fleet.url, "-o", str(out)]) == 0
    data = yaml.safe_load(out.read_text())
    assert data["initial"]["nodes"][node]["draining"] is True
    result = run_scenario(load_scenario(out))
    # the twin's controller goes on moving replicas off the node, make-before-break (a
    # 2-node replica there never finds room: the other fabric has a failed GPU)
    on_node = {
        r["id"]
        for r in data["initial"]["replicas"]
        if node in [s["node"] for s in r.get("shards", [])]
    }
    assert {e["replica"] for e in _events(result, "replica.moving")} & on_node
    assert not _events(result, "replica.failed")


def test_unreachable_controller_is_one_line_and_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LLMGW_TWIN_TOKEN", "lgw_whatever")
    (port,) = free_ports(1)
    out = tmp_path / "fleet.yaml"
    assert main(["snapshot", "--controller", f"http://127.0.0.1:{port}", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: cannot reach the controller")
    assert list(tmp_path.iterdir()) == []


def test_refused_credential_is_one_line_and_leaves_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "fleet.yaml"
    out.write_text("the file from before\n")
    (tmp_path / "c").mkdir()
    with running_fleet(tmp_path / "c") as fleet:
        fleet.add_node("n1", "ib-a", 8)
        monkeypatch.setenv("LLMGW_TWIN_TOKEN", "lgw_not-a-token-of-this-controller")
        assert main(["snapshot", "--controller", fleet.url, "-o", str(out)]) == 2
        monkeypatch.delenv("LLMGW_TWIN_TOKEN")
        assert main(["snapshot", "--controller", fleet.url, "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2
    assert all("refused the credential (401)" in line for line in err)
    assert out.read_text() == "the file from before\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c", "fleet.yaml"]


BASE = """\
name: from-a-snapshot
seed: 3
duration: 3m
cluster:
  fabrics: {ib-a: [node01, node02], ib-b: [node03, node04]}
  nodes:
    default: {gpus: 8, engines: [sim]}
profiles:
  big: {engine: sim, nodes: 2, gpus_per_node: 4, load_time: 20s, model: /m/big}
  small: {engine: sim, gpus_per_node: 2, load_time: 5s, model: /m/small}
deployments:
  - {model: big, profile: big, replicas: 2}
  - {model: small, profile: small, replicas: 1}
initial:
  nodes:
    node04: {failed_gpus: [7], cordoned: true}
  quarantines:
    - {node: node02, profile: small, for: 20m, reason: crash loop}
  replicas:
    - id: big-r1
      model: big
      profile: big
      state: ready
      shards:
        - {rank: 0, node: node01, gpus: [0, 1, 2, 3]}
        - {rank: 1, node: node02, gpus: [0, 1, 2, 3]}
    - id: big-r4
      model: big
      profile: big
      state: ready
      shards:
        - {rank: 0, node: node03, gpus: [0, 1, 2, 3]}
        - {rank: 1, node: node04, gpus: [4, 5, 6, 3]}
    - id: small-r2
      model: small
      profile: small
      state: ready
      shards: [{rank: 0, node: node01, gpus: [6, 7]}]
"""


def test_a_hand_written_initial_state_runs_idle_and_deterministically() -> None:
    first = run_scenario(load_scenario_text(BASE, "base.yaml"))
    assert first.passed and first.engine_starts == 0
    kinds = [e.kind for e in first.trace]
    assert kinds.count("replica.adopted") == 3
    assert not {"replica.placed", "replica.failed", "replica.reaped"} & set(kinds)
    again = run_scenario(load_scenario_text(BASE, "base.yaml"))
    assert again.trace_sha256 == first.trace_sha256


def test_a_starting_replica_loads_and_a_pending_one_is_placed() -> None:
    text = BASE.replace(
        "      state: ready\n      shards: [{rank: 0, node: node01, gpus: [6, 7]}]",
        "      state: starting\n      shards: [{rank: 0, node: node01, gpus: [6, 7]}]",
    ).replace(
        "  - {model: small, profile: small, replicas: 1}",
        "  - {model: small, profile: small, replicas: 2}",
    )
    text += "    - {id: small-r3, model: small, profile: small, state: pending}\n"
    result = run_scenario(load_scenario_text(text, "s.yaml"))
    adopted = {e["replica"]: e["ready"] for e in _events(result, "replica.adopted")}
    assert adopted == {"big-r1": True, "big-r4": True, "small-r2": False}
    ready = [e["replica"] for e in _events(result, "replica.ready")]
    assert "small-r2" in ready
    placed = [e["replica"] for e in _events(result, "replica.placed")]
    assert placed == ["small-r4"]  # the pending one is not restored: a new id, after the last


@pytest.mark.parametrize(
    ("old", "new", "line", "message"),
    [
        ("    node04: {failed", "    node09: {failed", 16, "unknown node 'node09'"),
        ("{failed_gpus: [7]", "{failed_gpus: [8]", 16, "node node04 has GPUs 0..7"),
        ("profile: small, for", "profile: tiny, for", 18, "unknown profile 'tiny'"),
        ("- id: big-r4", "- id: big-r1", 27, "replica 'big-r1' is listed twice"),
        ("- id: big-r4", "- id: small-r4", 27, "'small-r4' is not 'big-rN'"),
        (
            "node: node04, gpus: [4, 5, 6, 3]",
            "node: node02, gpus: [4, 5, 6, 3]",
            33,
            "node02 is in fabric ib-a, the replica's other shards in ib-b",
        ),
        ("gpus: [4, 5, 6, 3]", "gpus: [4, 5, 6, 7]", 33, "GPU 7 of node04 is failed"),
        ("gpus: [4, 5, 6, 3]", "gpus: [4, 5, 6]", 33, "takes 4 GPU(s) a node, 3 listed"),
        ("gpus: [6, 7]", "gpus: [3, 7]", 38, "GPU 3 of node01 is held by big-r1 already"),
        ("{rank: 1, node: node02", "{rank: 0, node: node02", 26, "rank 0 is listed twice"),
        (
            "      state: ready\n      shards: [{",
            "      state: dead\n      shards: [{",
            37,
            "unknown replica state 'dead'",
        ),
        (
            "    node04: {failed_gpus: [7], cordoned: true}",
            "    node04: {failed_gpus: [7], cordoned: false, draining: true}",
            16,
            "a draining node is cordoned",
        ),
        ("  replicas:\n    - id: big-r1", "  replica:\n    - id: big-r1", 19, "replica"),
    ],
)
def test_loader_refuses_a_bad_initial_section(old: str, new: str, line: int, message: str) -> None:
    assert old in BASE
    with pytest.raises(ScenarioError) as got:
        load_scenario_text(BASE.replace(old, new, 1), "bad.yaml")
    err = got.value
    assert (err.path, err.line) == ("bad.yaml", line), str(err)
    assert message in str(err)


def test_real_mode_refuses_an_initial_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(BASE)
    assert main(["run", "--real", str(path)]) == 2
    assert "real mode does not start from an `initial` state" in capsys.readouterr().err


def test_a_lost_node_stays_off_and_is_declared_lost_again() -> None:
    text = BASE.replace("node04: {failed_gpus: [7], cordoned: true}", "node04: {state: lost}")
    result = run_scenario(load_scenario_text(text, "lost.yaml"))
    lost = _events(result, "node.lost")
    assert [(e["node"], e["t_ms"]) for e in lost] == [("node04", 60_000)]
    assert [e["replica"] for e in _events(result, "replica.failed")] == ["big-r4"]


def test_a_snapshot_carries_the_topology_and_the_profiles_rules() -> None:
    from llmgw_twin.service.ops.snapshot import scenario_text

    def node(name: str, leaf: str, spine: str, domain: str) -> dict[str, Any]:
        where = {"leaf": leaf, "spine": spine, "nvlink_domain": domain}
        return {
            "node": name,
            "fabric": "ib-a",
            "gpu_count": 8,
            "gpu_memory_mib": 81920,
            "engines": ["sim"],
            "topology": where,
            "state": "alive",
        }

    state = {
        "t_ms": 1_000,
        "nodes": [
            node("n1", "leaf-1", "spine-1", "nvl-1"),
            node("n2", "leaf-1", "spine-1", "nvl-1"),
            node("n3", "leaf-2", "spine-1", "nvl-2"),
        ],
        "replicas": [],
        "deployments": [{"model": "tp", "profile": "tp", "replicas": 1}],
        "profiles": {
            "tp": {
                "engine": "sim",
                "nodes": 2,
                "gpus_per_node": 8,
                "model": "/m/tp",
                "topology": {"nvlink": "same_domain", "leaves": "fewest"},
            }
        },
        "timings": {},
    }
    text = scenario_text(state, "topo", 60_000, 0, "a test")
    data = yaml.safe_load(text)
    assert data["cluster"]["topology"] == {
        "leaves": {"leaf-1": ["n1", "n2"], "leaf-2": ["n3"]},
        "spines": {"spine-1": ["leaf-1", "leaf-2"]},
        "nvlink_domains": {"nvl-1": ["n1", "n2"], "nvl-2": ["n3"]},
    }
    sc = load_scenario_text(text, "topo.yaml")
    (profile,) = sc.profiles
    assert (profile.topology.nvlink, profile.topology.leaves) == ("same_domain", "fewest")
    by_node = {str(n.node): n.topology for n in sc.nodes}
    assert by_node["n3"] is not None and by_node["n3"].nvlink_domain == "nvl-2"
    result = run_scenario(sc)
    placed = [e for e in result.trace if e.kind == "replica.placed"]
    assert [e.get("nodes") for e in placed] == [("n1", "n2")]  # one domain
