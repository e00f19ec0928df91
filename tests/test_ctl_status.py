"""`llmgw-twin ctl status` against a real controller on loopback: its tables say what the state
says (fabrics, nodes, replicas per model, pending replicas); `--json` is the state itself; a
wrong token exits 1, no controller exits 2."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from helpers.controller import PROFILE, registration
from helpers.live import live_controller
from helpers.services import free_ports, wait_sync
from llmgw_twin.cli import main
from llmgw_twin.control.model import NodeId, ShardReport, ShardState, Timings
from llmgw_twin.control.protocol import Heartbeat
from llmgw_twin.service.common.auth import new_token, token_hash
from llmgw_twin.service.common.wire import HeartbeatW, ShardSpecW
from llmgw_twin.service.controller.app import ControllerRuntime
from llmgw_twin.service.controller.config import ControllerAuth, ControllerSettings
from llmgw_twin.service.controller.routes import create_controller_app

# nothing goes suspect while the test reads the state twice: heard once, silent for a minute
STEADY = Timings(
    heartbeat_interval_ms=1_000,
    node_suspect_after_ms=60_000,
    node_lost_after_ms=120_000,
    reconcile_interval_ms=50,
)
FABRICS = {"n1": "ib-a", "n2": "ib-a", "n3": "ib-b", "n4": "ib-b"}
BIG = {"engine": "sim", "gpus_per_node": 16, "model": "/models/big"}  # fits no node (8 GPUs)


@dataclass
class Fleet:
    url: str
    token_file: Path

    def ctl(self, *words: str) -> list[str]:
        return [
            "ctl",
            "status",
            *words,
            "--controller",
            self.url,
            "--token-file",
            str(self.token_file),
        ]


def _beat(node: str, *reports: ShardReport, failed: tuple[int, ...] = ()) -> dict[str, Any]:
    return HeartbeatW.from_core(Heartbeat(NodeId(node), reports, failed)).model_dump(mode="json")


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    """Four nodes in two fabrics (n3 with GPU 2 failed), three replicas of `tiny` placed (one of
    them ready), one replica of `big` pending: it fits no node."""
    admin = new_token()
    auth = ControllerAuth((token_hash(admin),), (), tmp_path / "secret.key")
    settings = ControllerSettings("127.0.0.1", 0, str(tmp_path / "c.db"), STEADY, (), (), auth=auth)
    assigned: list[dict[str, Any]] = []
    lock = threading.Lock()

    def agent(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/assign":
            with lock:
                assigned.extend(json.loads(request.content)["shards"])
        return httpx.Response(200, json={"ok": True})

    def build() -> FastAPI:
        runtime = ControllerRuntime(settings, agent_transport=httpx.MockTransport(agent))
        return create_controller_app(runtime)

    as_admin = {"authorization": f"Bearer {admin}"}
    with live_controller(build) as url, httpx.Client(base_url=url, timeout=30) as c:
        tokens = {}
        for node, fabric in FABRICS.items():
            r = c.post(
                f"/v1/admin/nodes/{node}/credential",
                json={"agent_url": f"http://agent-{node}"},
                headers=as_admin,
            )
            assert r.status_code == 200, r.text
            tokens[node] = {"authorization": f"Bearer {r.json()['token']}"}
            body = registration(node, fabric=fabric)
            assert c.post("/v1/agents/register", json=body, headers=tokens[node]).is_success
        r = c.post("/v1/agents/heartbeat", json=_beat("n3", failed=(2,)), headers=tokens["n3"])
        assert r.is_success, r.text
        for name, profile in (("tiny", PROFILE), ("big", BIG)):
            assert c.put(f"/v1/admin/profiles/{name}", json=profile, headers=as_admin).is_success
        for model, count in (("tiny", 3), ("big", 1)):
            body = {"profile": model, "replicas": count}
            r = c.put(f"/v1/admin/deployments/{model}", json=body, headers=as_admin)
            assert r.is_success, r.text

        def first_assigned() -> dict[str, Any] | None:
            with lock:
                return assigned[0] if len(assigned) >= 1 else None

        spec = ShardSpecW.model_validate(wait_sync(first_assigned, 10, "a tiny shard assigned"))
        core_spec = spec.to_core()
        up = ShardReport(core_spec, ShardState.SERVING, "http://engine:8000", None, ())
        node = core_spec.node
        failed = (2,) if node == "n3" else ()
        r = c.post(
            "/v1/agents/heartbeat", json=_beat(node, up, failed=failed), headers=tokens[node]
        )
        assert r.is_success, r.text

        def settled() -> bool | None:
            reps = c.get("/v1/admin/state", headers=as_admin).json()["replicas"]
            states = sorted((x["model"], x["state"]) for x in reps)
            want = [("big", "pending"), ("tiny", "placed"), ("tiny", "placed"), ("tiny", "ready")]
            return True if states == want else None

        wait_sync(settled, 10, "tiny: 1 ready and 2 placed; big pending")
        token_file = tmp_path / "admin.token"
        token_file.write_text(admin + "\n")
        yield Fleet(url, token_file)


def _blocks(out: str) -> list[list[str]]:
    return [b.splitlines() for b in out.strip().split("\n\n")]


def _rows(block: list[str]) -> list[list[str]]:
    """A table's rows, cut into as many cells as its header has (the last keeps its spaces)."""
    width = len(block[0].split())
    return [line.split(None, width - 1) for line in block[1:]]


def _state(f: Fleet, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(f.ctl("--json")) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def test_the_tables_say_what_the_state_says(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    state = _state(fleet, capsys)
    assert main(fleet.ctl("--nodes")) == 0
    head, fabrics, nodes, models, pending = _blocks(capsys.readouterr().out)
    assert head == [
        "4 nodes in 2 fabrics; 4 live replicas of 2 deployments; mass-loss hold: off; "
        "leader c1 in epoch 1; standbys: none"
    ]
    by_node = {n["node"]: n for n in state["nodes"]}
    used = {
        name: sum(1 for g in n["gpus"] if g["replica"] is not None) for name, n in by_node.items()
    }
    assert sum(used.values()) == 3  # three 1-GPU replicas of tiny; big has none

    assert fabrics[0].split() == ["FABRIC", "NODES", "ALIVE", "SUSPECT", "LOST", "GPUS", "FAILED"]
    assert _rows(fabrics) == [
        ["ib-a", "2", "2", "0", "0", f"{used['n1'] + used['n2']}/16", "0"],
        ["ib-b", "2", "2", "0", "0", f"{used['n3'] + used['n4']}/16", "1"],
    ]
    assert nodes[0].split() == ["NODE", "FABRIC", "HEALTH", "LINK", "GPUS", "FAILED", "FLAGS"]
    assert _rows(nodes) == [
        [name, FABRICS[name], "alive", "up", f"{used[name]}/8", "2" if name == "n3" else "-", "-"]
        for name in sorted(FABRICS)
    ]
    assert by_node["n3"]["failed_gpus"] == [2]

    assert models[0].split() == [
        "MODEL",
        "PROFILE",
        "WANTED",
        "LIVE",
        "READY",
        "ROUTABLE",
        "STATES",
    ]
    assert _rows(models) == [
        ["big", "big", "1", "1", "0", "0", "pending=1"],
        ["tiny", "tiny", "3", "3", "1", "1", "placed=2 ready=1"],
    ]
    (big,) = [r for r in state["replicas"] if r["model"] == "big"]
    assert pending[0].split() == ["PENDING", "MODEL", "PROFILE", "REASON"]
    # the reason the state gives, when it gives one
    assert _rows(pending) == [[big["replica"], "big", "big", big.get("reason") or "-"]]


def test_without_nodes_a_line_per_fabric_only(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(fleet.ctl()) == 0
    blocks = _blocks(capsys.readouterr().out)
    assert [b[0].split()[0] for b in blocks[1:]] == ["FABRIC", "MODEL", "PENDING"]
    assert [row[0] for row in _rows(blocks[1])] == ["ib-a", "ib-b"]


def test_a_wrong_token_exits_1_and_no_controller_exits_2(
    fleet: Fleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wrong = tmp_path / "wrong.token"
    wrong.write_text(new_token())
    words = ["ctl", "status", "--controller", fleet.url, "--token-file", str(wrong)]
    assert main(words) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "refused (401)" in captured.err
    (port,) = free_ports(1)
    assert main(["ctl", "status", "--controller", f"http://127.0.0.1:{port}"]) == 2
    assert "cannot reach the controller" in capsys.readouterr().err


def test_a_node_not_heard_from_shows_its_link_as_the_last_value_heard() -> None:
    """A suspect or lost node's link is what it said last: `unknown (last up)`, never `up`."""
    from llmgw_twin.service.ops.ctl_status import render

    def node(name: str, health: str, link_up: bool) -> dict[str, Any]:
        return {
            "node": name,
            "fabric": "ib-a",
            "state": health,
            "stale": health != "alive",
            "fabric_link_up": link_up,
            "gpus": [],
            "gpu_count": 8,
            "failed_gpus": [],
        }

    state = {
        "nodes": [
            node("a1", "alive", True),
            node("a2", "suspect", True),
            node("a3", "lost", False),
        ],
        "fabrics": [{"fabric": "ib-a", "nodes": ["a1", "a2", "a3"]}],
    }
    lines = {line.split()[0]: line for line in render(state, every_node=True).splitlines() if line}
    assert lines["a1"].split()[2:4] == ["alive", "up"]
    assert "unknown (last up)" in lines["a2"] and " up " not in lines["a2"].replace("(last up)", "")
    assert "unknown (last down)" in lines["a3"]
