"""`llmgw-twin ctl cordon|uncordon|drain|explain|deployment delete|gpu clear` against a real
controller on loopback, with fake agents that report every shard assigned to them serving: a
drain empties its node make-before-break and `--wait` sees it through; a deployment that can
never fit is accepted with a warning saying why; deleted deployments leave nothing behind;
unknown names are refused (exit 1)."""

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
from helpers.services import wait_sync
from llmgw_twin.cli import main
from llmgw_twin.control.model import NodeId, ShardReport, ShardState
from llmgw_twin.control.protocol import Heartbeat
from llmgw_twin.service.common.auth import new_token, token_hash
from llmgw_twin.service.common.wire import HeartbeatW, ShardSpecW
from llmgw_twin.service.controller.app import ControllerRuntime
from llmgw_twin.service.controller.config import ControllerAuth, ControllerSettings
from llmgw_twin.service.controller.routes import create_controller_app
from test_ctl_status import STEADY

NODES = ("n1", "n2", "n3")
BIG = {"engine": "sim", "gpus_per_node": 16, "model": "/models/big"}  # fits no node (8 GPUs)
BEATS = 1_200
"""The fake agents' heartbeat rounds at most (50 ms apart: a minute)."""


@dataclass
class Fleet:
    url: str
    token_file: Path
    client: httpx.Client
    admin: dict[str, str]

    def ctl(self, *words: str) -> list[str]:
        return ["ctl", *words, "--controller", self.url, "--token-file", str(self.token_file)]

    def state(self) -> dict[str, Any]:
        r = self.client.get("/v1/admin/state", headers=self.admin)
        assert r.status_code == 200, r.text
        out: dict[str, Any] = r.json()
        return out

    def on(self, node: str) -> list[str]:
        return sorted(
            r["replica"]
            for r in self.state()["replicas"]
            if node in r["nodes"] and r["model"] == "tiny"
        )

    def ready(self, model: str) -> int:
        return sum(1 for r in self.state()["replicas"] if r["model"] == model and r["routable"])


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    """n1, n2, n3 in ib-a, 8 GPUs each; two 1-GPU replicas of `tiny`, ready."""
    admin = new_token()
    auth = ControllerAuth((token_hash(admin),), (), tmp_path / "secret.key")
    settings = ControllerSettings("127.0.0.1", 0, str(tmp_path / "c.db"), STEADY, (), (), auth=auth)
    assigned: dict[str, list[dict[str, Any]]] = {}
    lock = threading.Lock()

    def agent(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/assign":
            with lock:  # the node's whole shard set, newest wins
                assigned[request.url.host.removeprefix("agent-")] = json.loads(request.content)[
                    "shards"
                ]
        return httpx.Response(200, json={"ok": True})

    def build() -> FastAPI:
        runtime = ControllerRuntime(settings, agent_transport=httpx.MockTransport(agent))
        return create_controller_app(runtime)

    as_admin = {"authorization": f"Bearer {admin}"}
    stop = threading.Event()
    with live_controller(build) as url, httpx.Client(base_url=url, timeout=30) as c:
        tokens = {}
        for node in NODES:
            r = c.post(
                f"/v1/admin/nodes/{node}/credential",
                json={"agent_url": f"http://agent-{node}"},
                headers=as_admin,
            )
            assert r.status_code == 200, r.text
            tokens[node] = {"authorization": f"Bearer {r.json()['token']}"}
            body = registration(node, fabric="ib-a")
            assert c.post("/v1/agents/register", json=body, headers=tokens[node]).is_success

        def agents() -> None:
            """Every node reports each shard assigned to it up, until the test ends."""
            with httpx.Client(base_url=url, timeout=10) as beat:
                for _ in range(BEATS):
                    if stop.wait(0.05):
                        return
                    for node in NODES:
                        with lock:
                            shards = list(assigned.get(node, []))
                        reports = []
                        for raw in shards:
                            spec = ShardSpecW.model_validate(raw).to_core()
                            up = ShardState.SERVING if spec.rank == 0 else ShardState.RUNNING
                            endpoint = (
                                f"http://engine-{spec.replica}:8000" if spec.rank == 0 else None
                            )
                            reports.append(ShardReport(spec, up, endpoint, None, ()))
                        msg = Heartbeat(NodeId(node), tuple(reports))
                        body = HeartbeatW.from_core(msg).model_dump(mode="json")
                        beat.post("/v1/agents/heartbeat", json=body, headers=tokens[node])

        beats = threading.Thread(target=agents, name="fake-agents", daemon=True)
        beats.start()
        try:
            assert c.put("/v1/admin/profiles/tiny", json=PROFILE, headers=as_admin).is_success
            body = {"profile": "tiny", "replicas": 2}
            r = c.put("/v1/admin/deployments/tiny", json=body, headers=as_admin)
            assert r.is_success and r.json()["warnings"] == [], r.text
            token_file = tmp_path / "admin.token"
            token_file.write_text(admin + "\n")
            f = Fleet(url, token_file, c, as_admin)
            wait_sync(lambda: True if f.ready("tiny") == 2 else None, 20, "two ready replicas")
            yield f
        finally:
            stop.set()
            beats.join(timeout=30)


def _json(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def test_cordon_and_uncordon(fleet: Fleet, capsys: pytest.CaptureFixture[str]) -> None:
    free = next(n for n in NODES if not fleet.on(n))
    assert main(fleet.ctl("cordon", free, "-o", "json")) == 0
    assert _json(capsys) == {"node": free, "cordoned": True, "changed": True}
    assert main(fleet.ctl("cordon", free)) == 0  # prose, as every ctl write prints
    assert capsys.readouterr().out == (
        f"node {free}: cordoned, out of placement (what it runs keeps running) "
        "(it already was: nothing changed)\n"
    )
    (entry,) = [n for n in fleet.state()["nodes"] if n["node"] == free]
    assert entry["cordoned"] is True and entry["draining"] is False
    # a new replica does not go to the cordoned node, though it is the emptiest
    body = {"profile": "tiny", "replicas": 3}
    assert fleet.client.put("/v1/admin/deployments/tiny", json=body, headers=fleet.admin)
    wait_sync(lambda: True if fleet.ready("tiny") == 3 else None, 20, "a third ready replica")
    assert fleet.on(free) == []
    assert main(fleet.ctl("uncordon", free)) == 0
    assert capsys.readouterr().out == (
        f"node {free}: uncordoned, back in placement (a drain under way ends)\n"
    )
    assert main(fleet.ctl("uncordon", free, "-o", "yaml")) == 0
    assert "changed: false" in capsys.readouterr().out
    assert main(fleet.ctl("cordon", "nosuch")) == 1
    assert "unknown node nosuch" in capsys.readouterr().err


def test_drain_wait_empties_the_node_make_before_break(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    busy = next(n for n in NODES if fleet.on(n))
    (original,) = fleet.on(busy)
    assert main(fleet.ctl("drain", busy, "--wait", "30s")) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith(f"node {busy}: 1 replica(s) left: {original}")
    assert lines[-1] == f"node {busy}: drained, nothing left on it (still cordoned)"
    assert fleet.on(busy) == [] and fleet.ready("tiny") == 2
    ids = {r["replica"] for r in fleet.state()["replicas"]}
    assert original not in ids
    events = fleet.client.get("/v1/admin/events", headers=fleet.admin).json()["events"]
    kinds = [e["kind"] for e in events]
    assert kinds.index("node.draining") < kinds.index("replica.moved") < kinds.index("node.drained")
    # the original was reaped only once its copy was ready
    text = [json.dumps(e, sort_keys=True) for e in events]
    (moved,) = [t for t in text if '"replica.moved"' in t]
    copy = json.loads(moved)
    copy = copy.get("to") or copy.get("subjects", {}).get("to")
    assert isinstance(copy, str) and copy.startswith("tiny-r")
    ready_at = [i for i, t in enumerate(text) if '"replica.ready"' in t and f'"{copy}"' in t]
    reaped_at = [i for i, t in enumerate(text) if '"replica.reaped"' in t and f'"{original}"' in t]
    assert ready_at and reaped_at and ready_at[0] < reaped_at[0]

    # the reaped original is explained with its reap's cause, from the controller's log
    assert main(fleet.ctl("explain", original, "-o", "json")) == 0
    gone = _json(capsys)
    assert gone["state"] == "reaped" and gone["cause"]["event"] == "replica.reaped"
    assert busy in gone["cause"]["reason"], gone  # the drain of the node it was on
    assert main(fleet.ctl("explain", original)) == 0
    assert f"why: reaped: {gone['cause']['reason']}" in capsys.readouterr().out


def test_a_drain_wait_that_runs_out_says_the_drain_goes_on(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    busy = next(n for n in NODES if fleet.on(n))
    others = [n for n in NODES if n != busy]
    for node in others:  # no room for a copy until they are back: the wait cannot be met
        assert main(fleet.ctl("cordon", node)) == 0
    assert main(fleet.ctl("drain", busy, "--wait", "1ms")) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == (
        f"node {busy}: not drained after 1ms; the drain goes on in the controller "
        f"(`llmgw-twin ctl drain {busy} --wait D` waits again; `llmgw-twin ctl uncordon {busy}` "
        "cancels it and puts the node back into placement)"
    )
    # it did go on: with room again, the node empties with no ctl waiting on it
    for node in others:
        assert main(fleet.ctl("uncordon", node)) == 0
    wait_sync(lambda: True if fleet.on(busy) == [] else None, 20, "the drain to finish")
    (entry,) = [n for n in fleet.state()["nodes"] if n["node"] == busy]
    assert entry["cordoned"] is True


def test_explain_by_model_lists_its_replicas_and_a_typo_gets_a_hint(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    live = sorted(r["replica"] for r in fleet.state()["replicas"] if r["model"] == "tiny")
    assert main(fleet.ctl("explain", "tiny")) == 0
    out = capsys.readouterr().out
    assert out.startswith("model tiny: deployed as 2 x profile tiny; 2 live replica(s)\n")
    for rid in live:
        assert f"replica {rid} of tiny (profile tiny): ready" in out
    assert main(fleet.ctl("explain", "tiny", "-o", "json")) == 0
    answer = _json(capsys)
    assert [r["replica"] for r in answer["replicas"]] == live
    assert main(fleet.ctl("explain", "tinny")) == 1
    err = capsys.readouterr().err
    assert "no replica and no model tinny" in err
    assert "takes a replica id (such as tiny-r3) or a model name" in err


def test_a_deployment_that_can_never_fit_is_accepted_with_the_reason(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    c, admin = fleet.client, fleet.admin
    assert c.put("/v1/admin/profiles/big", json=BIG, headers=admin).is_success
    r = c.put("/v1/admin/deployments/big", json={"profile": "big", "replicas": 1}, headers=admin)
    assert r.status_code == 200
    (warning,) = r.json()["warnings"]
    assert warning == (
        "deployment big can never fit: needs 1 node(s) with 16 working GPU(s) and engine sim "
        "in one fabric: no registered node has that"
    )

    def pending() -> str | None:
        reps = [x for x in fleet.state()["replicas"] if x["model"] == "big"]
        return reps[0]["replica"] if reps and reps[0]["reason"] else None

    rid = wait_sync(pending, 10, "big pending with a reason")
    assert main(fleet.ctl("explain", rid)) == 0
    out = capsys.readouterr().out
    assert f"replica {rid} of big (profile big): pending" in out
    assert "never fits the fleet as registered: needs 1 node(s) with 16" in out
    assert "ib-a: 0 of 1 node(s) needed; other nodes: 3 too few free GPUs" in out
    assert main(fleet.ctl("explain", rid, "--json")) == 0
    assert _json(capsys)["fabrics"][0]["blocked"] == {"too few free GPUs": 3}
    assert main(fleet.ctl("explain", "nosuch-r1")) == 1


def test_deployment_delete_retires_every_replica(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    before = sorted(r["replica"] for r in fleet.state()["replicas"])
    assert main(fleet.ctl("deployment", "delete", "tiny", "-o", "json")) == 0
    answer = _json(capsys)
    assert answer == {"model": "tiny", "deleted": True, "replicas_retired": before}
    state = fleet.state()
    assert state["replicas"] == [] and state["deployments"] == []
    assert main(fleet.ctl("deployment", "delete", "tiny")) == 1
    assert "no deployment of model tiny" in capsys.readouterr().err


def test_gpu_clear_is_refused_for_a_gpu_that_is_not_failed(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(fleet.ctl("gpu", "clear", "n1", "0")) == 1
    assert "not marked failed" in capsys.readouterr().err


def test_a_set_of_deployments_is_applied_in_one_go_or_not_at_all(fleet: Fleet) -> None:
    c, admin = fleet.client, fleet.admin
    assert c.put("/v1/admin/profiles/big", json=BIG, headers=admin).is_success
    both = {"tiny": {"profile": "tiny", "replicas": 3}, "big": {"profile": "big", "replicas": 1}}
    bad = both | {"other": {"profile": "nope", "replicas": 1}}
    r = c.put("/v1/admin/deployments", json={"deployments": bad}, headers=admin)
    assert r.status_code == 422 and "unknown profile(s): nope" in r.text
    wanted = {d["model"]: d["replicas"] for d in fleet.state()["deployments"]}
    assert wanted == {"tiny": 2}  # nothing of the refused set was applied
    r = c.put("/v1/admin/deployments", json={"deployments": both}, headers=admin)
    assert r.status_code == 200, r.text
    assert r.json()["deployments"] == ["big", "tiny"]
    assert [w.split(":")[0] for w in r.json()["warnings"]] == ["deployment big can never fit"]
    wanted = {d["model"]: d["replicas"] for d in fleet.state()["deployments"]}
    assert wanted == {"big": 1, "tiny": 3}
    wait_sync(lambda: True if fleet.ready("tiny") == 3 else None, 20, "a third ready replica")
