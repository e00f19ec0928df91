"""Role groups through the controller service: a deployment of roles put through the admin API
(and read from the controller's config file) is placed whole with each member's group and role
on its events, kept across a restart from the store, and a change of its roles is refused with
nothing changed; a snapshot of a fleet running a group starts the twin with that group. The
controller runs in-process behind ASGI on a SQLite file of the test's, or (for the snapshot) on
loopback with fake agents (`helpers.fake_fleet`)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from pydantic import ValidationError

from helpers.controller import controller
from helpers.fake_fleet import running_fleet
from helpers.services import node_info, wait_sync
from llmgw_twin.cli import main
from llmgw_twin.control.model import ProfileName, Role
from llmgw_twin.control.protocol import NodeRegistered
from llmgw_twin.service.common.config import ConfigError
from llmgw_twin.service.common.limits import MAX_REPLICAS
from llmgw_twin.service.common.wire import DeploymentW, NodeRegisteredW
from llmgw_twin.service.controller.config import load_controller_config
from llmgw_twin.service.ops.ctl_fleet import render_explain
from llmgw_twin.twin.scenario.loader import load_scenario
from llmgw_twin.twin.world.runner import run_scenario

ROLES: list[dict[str, Any]] = [
    {"name": "prefill", "profile": "pre"},
    {"name": "decode", "profile": "dec", "count": 2},
]
PROFILE = {"engine": "sim", "gpus_per_node": 8, "model": "/m"}


def registration(name: str, fabric: str) -> dict[str, object]:
    msg = NodeRegistered(node_info(name, fabric), (), incarnation=1)
    return NodeRegisteredW.from_core(msg, f"http://agent-{name}").model_dump(mode="json")


async def placed(client: httpx.AsyncClient, want: int) -> list[dict[str, Any]]:
    """The subjects of the `replica.placed` events, once `want` of them are logged (bounded)."""
    for _ in range(500):
        events = (await client.get("/v1/admin/events")).json()["events"]
        found = [e["subjects"] for e in events if e["kind"] == "replica.placed"]
        if len(found) >= want:
            return found
        await asyncio.sleep(0.01)
    raise AssertionError(f"fewer than {want} replica.placed events: {events}")


def test_a_deployment_of_roles_is_placed_whole_kept_across_a_restart_and_not_reshaped(
    tmp_path: Path,
) -> None:
    async def first(client: httpx.AsyncClient) -> None:
        for i, fabric in enumerate(["ib-a", "ib-a", "ib-a", "ib-b"]):
            r = await client.post("/v1/agents/register", json=registration(f"n{i + 1}", fabric))
            assert r.is_success
        for name in ("pre", "dec"):
            assert (await client.put(f"/v1/admin/profiles/{name}", json=PROFILE)).is_success
        body = {"profile": "pre", "replicas": 1, "roles": ROLES}
        assert (await client.put("/v1/admin/deployments/chat", json=body)).is_success
        found = await placed(client, 3)
        assert {e["fabric"] for e in found} == {"ib-a"}
        assert sorted(e["role"] for e in found) == ["decode", "decode", "prefill"]
        assert len({e["group"] for e in found}) == 1
        # `ctl explain` of a member names its group and partners
        rid = next(e["replica"] for e in found if e["role"] == "prefill")
        explained = (await client.get(f"/v1/admin/replicas/{rid}/explain")).json()
        assert explained["group"]["role"] == "prefill"
        assert sorted(m["role"] for m in explained["group"]["members"].values()) == [
            "decode",
            "decode",
            "prefill",
        ]
        assert f"prefill of role group {found[0]['group']}: " in render_explain(explained)

        # the roles cannot change in place; the count of a role can (roles in any order)
        fewer = {"profile": "pre", "replicas": 1, "roles": [ROLES[1] | {"count": 1}, ROLES[0]]}
        r = await client.put("/v1/admin/deployments/chat", json=fewer)
        assert r.status_code == 200, r.text
        swapped = [{"name": "prefill", "profile": "dec"}, {"name": "decode", "profile": "pre"}]
        r = await client.put(
            "/v1/admin/deployments/chat", json={"profile": "dec", "replicas": 1, "roles": swapped}
        )
        assert r.status_code == 422 and "cannot change in place" in r.text, r.text
        bad = {"profile": "pre", "replicas": 1, "roles": ROLES[:1]}
        assert (await client.put("/v1/admin/deployments/chat", json=bad)).status_code == 422

    async def second(client: httpx.AsyncClient) -> None:
        state = (await client.get("/v1/admin/state")).json()
        (chat,) = [d for d in state["deployments"] if d["model"] == "chat"]
        assert chat["roles"] == [
            {"name": "prefill", "profile": "pre", "count": 1},
            {"name": "decode", "profile": "dec", "count": 1},
        ]

    async def twice() -> None:  # the same store: the second is a restart
        for body in (first, second):
            async with controller(tmp_path) as (_, client):
                await body(client)

    asyncio.run(twice())


CONFIG = """\
listen: {{host: 127.0.0.1, port: 1}}
store: c.db
profiles:
  pre: {{engine: sim, gpus_per_node: 8, model: /m}}
  dec: {{engine: sim, gpus_per_node: 8, model: /m}}
deployments:
  - {deployment}
"""


def test_the_config_file_takes_a_deployment_of_roles(tmp_path: Path) -> None:
    path = tmp_path / "controller.yaml"
    roles = "roles: {prefill: {profile: pre}, decode: {profile: dec, count: 3}}"
    path.write_text(CONFIG.format(deployment=f"{{model: chat, replicas: 2, {roles}}}"))
    (dep,) = load_controller_config(path).deployments
    assert dep.roles == (Role("prefill", ProfileName("pre")), Role("decode", ProfileName("dec"), 3))
    assert (dep.profile, dep.replicas) == ("pre", 2)


@pytest.mark.parametrize(
    ("deployment", "message"),
    [
        ("{model: chat, replicas: 1}", "either a profile or roles"),
        (
            "{model: chat, replicas: 1, profile: pre, roles: {prefill: {profile: pre}}}",
            "either a profile or roles",
        ),
        ("{model: chat, replicas: 1, roles: {prefill: {profile: pre}}}", "missing role 'decode'"),
        (
            "{model: chat, replicas: 1, roles: {prefill: {profile: x}, decode: {profile: dec}}}",
            "roles.prefill.profile: unknown profile 'x'",
        ),
    ],
)
def test_a_bad_deployment_of_roles_in_the_config_is_refused(
    tmp_path: Path, deployment: str, message: str
) -> None:
    path = tmp_path / "controller.yaml"
    path.write_text(CONFIG.format(deployment=deployment))
    with pytest.raises(ConfigError, match=message):
        load_controller_config(path)


def test_a_snapshot_of_a_fleet_with_a_role_group_starts_the_twin_with_the_group_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "fleet.yaml"
    with running_fleet(tmp_path) as fleet:
        for node, fabric in (("n1", "ib-a"), ("n2", "ib-a"), ("n3", "ib-a"), ("n4", "ib-b")):
            fleet.add_node(node, fabric, 8)
        for name in ("pre", "dec"):
            fleet.put(f"/v1/admin/profiles/{name}", PROFILE)
        fleet.put("/v1/admin/deployments/chat", {"profile": "pre", "replicas": 1, "roles": ROLES})

        def ready() -> bool | None:
            live = fleet.state()["replicas"]
            return (len(live) == 3 and all(r["state"] == "ready" for r in live)) or None

        wait_sync(ready, 30, "the group's three replicas ready")
        monkeypatch.setenv("LLMGW_TWIN_TOKEN", fleet.admin)
        assert main(["snapshot", "--controller", fleet.url, "-o", str(out)]) == 0
        # the operator scales the groups with ctl; a profile change is refused up front
        ctl = ["ctl", "deployment", "set", "chat", "--controller", fleet.url]
        assert main([*ctl, "--replicas", "2", "--dry-run", "--seeds", "1"]) == 0
        assert "unplaceable at the end" in capsys.readouterr().out  # a second group fits nowhere
        assert main([*ctl, "--profile", "dec"]) == 2
        assert "deployed in roles" in capsys.readouterr().err
        assert main([*ctl, "--replicas", "2"]) == 0
        assert "2 role group(s) of 1 prefill of pre, 2 decode of dec" in capsys.readouterr().out
        (chat,) = fleet.state()["deployments"]
        assert chat["replicas"] == 2 and [r["name"] for r in chat["roles"]] == [
            "prefill",
            "decode",
        ]
        assert main([*ctl, "--replicas", "1"]) == 0
    data = yaml.safe_load(out.read_text())
    (dep,) = data["deployments"]
    assert dep == {
        "model": "chat",
        "replicas": 1,
        "roles": {
            "prefill": {"profile": "pre", "count": 1},
            "decode": {"profile": "dec", "count": 2},
        },
    }
    members = data["initial"]["replicas"]
    assert sorted(r["role"] for r in members) == ["decode", "decode", "prefill"]
    assert len({r["group"] for r in members}) == 1

    result = run_scenario(load_scenario(out))
    assert result.passed
    assert [e for e in result.trace if e.kind in ("replica.placed", "replica.reaped")] == []
    adopted = [e for e in result.trace if e.kind == "replica.adopted"]
    assert sorted(str(e.get("role")) for e in adopted) == ["decode", "decode", "prefill"]
    assert {e.get("group") for e in adopted} == {members[0]["group"]}


def test_the_api_bounds_a_deployment_of_roles_by_its_replicas_not_its_groups() -> None:
    body = {"profile": "pre", "replicas": MAX_REPLICAS // 3, "roles": ROLES}  # 3 a group
    assert DeploymentW.model_validate(body).to_core("chat").replicas == MAX_REPLICAS // 3
    with pytest.raises(ValidationError, match="more than the"):
        DeploymentW.model_validate(body | {"replicas": MAX_REPLICAS // 3 + 1})
    with pytest.raises(ValidationError, match="prefill role's profile"):
        DeploymentW.model_validate(body | {"profile": "dec"})
