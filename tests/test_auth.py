"""Who may call what, through the controller's and the agent's own apps (`httpx.ASGITransport`):
every endpoint without a token, with a wrong one, with another kind's or another node's; a node
that speaks only for itself; onboarding, rotation and revocation; tokens that are never kept."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme

from helpers.services import FAST, eventually, node_info
from llmgw_twin.control.model import ShardReport, ShardSpec, ShardState
from llmgw_twin.control.protocol import Heartbeat, NodeRegistered
from llmgw_twin.service.agent.app import AgentRuntime, create_agent_app
from llmgw_twin.service.agent.config import load_agent_config
from llmgw_twin.service.common.auth import CredentialFile, new_token, token_hash
from llmgw_twin.service.common.wire import HeartbeatW, NodeRegisteredW, ShardSpecW
from llmgw_twin.service.controller.app import ControllerRuntime
from llmgw_twin.service.controller.config import ControllerAuth, ControllerSettings
from llmgw_twin.service.controller.routes import create_controller_app

PROFILE = {"engine": "sim", "nodes": 1, "gpus_per_node": 2, "model": "/models/tiny"}


@dataclass
class Fleet:
    """A controller that asks for credentials, its ASGI client, and the tokens of each kind."""

    runtime: ControllerRuntime
    client: httpx.AsyncClient
    admin: str
    api: str
    reader: str = ""
    """a reader token: the metrics and the admin reads, nothing that changes the fleet"""
    nodes: dict[str, str] = field(default_factory=dict)
    """node -> its token"""
    controller_tokens: dict[str, str] = field(default_factory=dict)
    sent: list[tuple[str, str, dict[str, Any], str | None]] = field(default_factory=list)
    """(agent host, path, body, authorization) of every command the controller sent"""

    def auth(self, token: str | None) -> dict[str, str]:
        return {"authorization": f"Bearer {token}"} if token is not None else {}

    async def onboard(self, node: str) -> dict[str, Any]:
        r = await self.client.post(
            f"/v1/admin/nodes/{node}/credential",
            json={"agent_url": f"http://agent-{node}"},
            headers=self.auth(self.admin),
        )
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        self.nodes[node] = body["token"]
        self.controller_tokens[node] = body["controller_token"]
        return body

    async def register(self, node: str, token: str | None, url: str | None = None) -> int:
        msg = NodeRegistered(node_info(node), (), incarnation=1)
        body = NodeRegisteredW.from_core(msg, url or f"http://agent-{node}").model_dump(mode="json")
        r = await self.client.post("/v1/agents/register", json=body, headers=self.auth(token))
        return r.status_code

    async def state(self) -> dict[str, Any]:
        r = await self.client.get("/v1/admin/state", headers=self.auth(self.admin))
        assert r.status_code == 200, r.text
        out: dict[str, Any] = r.json()
        return out


@asynccontextmanager
async def fleet(tmp_path: Path, *, api_keys: bool = True) -> AsyncIterator[Fleet]:
    admin, api, reader = new_token(), new_token(), new_token()
    auth = ControllerAuth(
        (token_hash(admin),),
        (token_hash(api),) if api_keys else (),
        tmp_path / "secret.key",
        reader_hashes=(token_hash(reader),),
    )
    settings = ControllerSettings("127.0.0.1", 0, str(tmp_path / "c.db"), FAST, (), (), auth=auth)
    sent: list[tuple[str, str, dict[str, Any], str | None]] = []

    def agent(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sent.append(
            (request.url.host, request.url.path, body, request.headers.get("authorization"))
        )
        return httpx.Response(200, json={"ok": True})

    runtime = ControllerRuntime(settings, agent_transport=httpx.MockTransport(agent))
    await runtime.start()
    transport = httpx.ASGITransport(app=create_controller_app(runtime))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://controller") as client:
            yield Fleet(runtime, client, admin, api, reader, sent=sent)
    finally:
        await runtime.stop()


def heartbeat(node: str, *reports: ShardReport) -> dict[str, Any]:
    return HeartbeatW.from_core(Heartbeat(node_info(node).node, reports)).model_dump(mode="json")


# Every endpoint of the controller, with a body that would be accepted, and who may call it.
ENDPOINTS: list[tuple[str, str, str, dict[str, Any] | None]] = [
    ("node", "POST", "/v1/agents/register", None),  # body built per caller
    ("node", "POST", "/v1/agents/heartbeat", None),
    ("admin", "PUT", "/v1/admin/profiles/tiny", PROFILE),
    ("admin", "PUT", "/v1/admin/deployments/tiny", {"profile": "tiny", "replicas": 0}),
    ("admin", "DELETE", "/v1/admin/nodes/n1/failed-gpus/0", None),
    ("admin", "DELETE", "/v1/admin/nodes/n1/quarantine", None),
    ("admin", "GET", "/v1/admin/state", None),
    ("admin", "GET", "/v1/admin/events", None),
    ("admin", "POST", "/v1/admin/nodes/n3/credential", {"agent_url": "http://agent-n3"}),
    ("admin", "DELETE", "/v1/admin/nodes/n3/credential", None),
    ("admin", "POST", "/v1/admin/nodes/n1/cordon", None),
    ("admin", "DELETE", "/v1/admin/nodes/n1/cordon", None),
    ("admin", "GET", "/v1/admin/nodes/n1/drain", None),
    ("admin", "POST", "/v1/admin/nodes/n2/drain", None),
    ("admin", "GET", "/v1/admin/replicas/tiny-r1/explain", None),
    ("admin", "GET", "/v1/admin/models/tiny/explain", None),
    ("admin", "DELETE", "/v1/admin/deployments/nope", None),
    ("admin", "GET", "/metrics", None),
    (
        "admin",
        "PUT",
        "/v1/admin/deployments",
        {"deployments": {"tiny": {"profile": "tiny", "replicas": 0}}},
    ),
    ("api", "GET", "/v1/models", None),
    ("api", "POST", "/v1/chat/completions", {"model": "tiny", "messages": []}),
    ("api", "POST", "/v1/completions", {"model": "tiny", "prompt": "hi"}),
]


def detail_of(r: httpx.Response) -> str:
    """A refusal's message: JSON's `detail`, or the text itself where the route answers in
    text (`/metrics`)."""
    if r.headers["content-type"].startswith("text/plain"):
        return r.text
    return str(r.json()["detail"])


def test_every_controller_endpoint_refuses_no_token_a_wrong_one_and_the_wrong_kind(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def go() -> None:
        async with fleet(tmp_path) as f:
            await f.onboard("n1")
            await f.onboard("n2")
            wrong = new_token()
            for who, method, path, accepted in ENDPOINTS:
                body = accepted
                if path.startswith("/v1/agents/"):
                    msg = NodeRegistered(node_info("n1"), (), incarnation=1)
                    body = (
                        NodeRegisteredW.from_core(msg, "http://agent-n1").model_dump(mode="json")
                        if path.endswith("register")
                        else heartbeat("n1")
                    )
                callers = {
                    "admin": f.admin,
                    "api": f.api,
                    "node": f.nodes["n1"],
                    "other node": f.nodes["n2"],
                    "reader": f.reader,
                }
                # an API client is told in its own words: no key, or a key that is not one
                missing = "no API key" if who == "api" else "missing credentials"
                invalid = "the API key matches none" if who == "api" else "invalid credentials"
                for token, status, detail in [
                    (None, 401, missing),
                    ("", 401, missing),
                    (wrong, 401, invalid),
                    (f.admin + "x", 401, invalid),
                ]:
                    headers = {"authorization": f"Bearer {token}"} if token is not None else {}
                    r = await f.client.request(method, path, json=body, headers=headers)
                    assert (r.status_code, detail_of(r)) == (status, detail.rstrip()) or (
                        r.status_code == status and detail_of(r).startswith(detail)
                    ), (path, token, r.text)
                    assert r.headers["www-authenticate"] == "Bearer"
                for kind, token in callers.items():
                    r = await f.client.request(method, path, json=body, headers=f.auth(token))
                    if kind == who or (kind == "reader" and who == "admin" and method == "GET"):
                        # a reader reads what an admin reads: the metrics, the state, explain
                        assert r.status_code not in (401, 403), (path, kind, r.text)
                    elif kind == "reader" and who == "admin":
                        assert r.status_code == 403, (path, r.text)
                        assert "a reader token reads the metrics and the admin state only" in (
                            detail_of(r)
                        )
                    elif kind == "other node" and who == "node":
                        # a node's token speaks for that node only
                        assert r.status_code == 403, (path, r.text)
                        assert "cannot speak for n1" in detail_of(r)
                    else:
                        assert r.status_code == 403, (path, kind, r.text)
                        assert "may not call this endpoint" in detail_of(r)
            # /health is open, and says nothing about the fleet
            assert (await f.client.get("/health")).json() == {"status": "ok"}
        # refusals are logged, the tokens never
        logged = "\n".join(r.getMessage() for r in caplog.records)
        assert "refused POST /v1/agents/register" in logged
        for token in (f.admin, f.api, f.reader, wrong, *f.nodes.values()):
            assert token not in logged

    with caplog.at_level(logging.INFO):
        asyncio.run(go())


def test_the_router_is_open_when_no_api_key_is_configured(tmp_path: Path) -> None:
    async def go() -> None:
        async with fleet(tmp_path, api_keys=False) as f:
            assert (await f.client.get("/v1/models")).status_code == 200
            assert (await f.client.get("/v1/admin/state")).status_code == 401

    asyncio.run(go())


async def ready_replica(f: Fleet) -> tuple[ShardSpec, dict[str, Any]]:
    """Onboard n1 and n2, deploy one 1-node replica, and make it ready from its own node."""
    for node in ("n1", "n2"):
        await f.onboard(node)
        assert await f.register(node, f.nodes[node]) == 200
    admin = f.auth(f.admin)
    assert (await f.client.put("/v1/admin/profiles/tiny", json=PROFILE, headers=admin)).is_success
    deployment = {"profile": "tiny", "replicas": 1}
    r = await f.client.put("/v1/admin/deployments/tiny", json=deployment, headers=admin)
    assert r.is_success

    async def assigned() -> ShardSpec | None:
        for _, path, body, _ in f.sent:
            if path == "/v1/assign" and body["shards"]:
                return ShardSpecW.model_validate(body["shards"][0]).to_core()
        return None

    spec = await eventually(assigned, 5, "the shard assigned")
    report = ShardReport(spec, ShardState.SERVING, f"http://engine-{spec.node}:8000", None, ())
    r = await f.client.post(
        "/v1/agents/heartbeat",
        json=heartbeat(spec.node, report),
        headers=f.auth(f.nodes[spec.node]),
    )
    assert r.status_code == 200, r.text

    async def ready() -> dict[str, Any] | None:
        [rep] = (await f.state())["replicas"]
        return rep if rep["state"] == "ready" else None

    return spec, await eventually(ready, 5, "the replica ready")


def test_a_forged_report_for_another_nodes_shard_is_refused_and_changes_nothing(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        async with fleet(tmp_path) as f:
            spec, before = await ready_replica(f)
            other = "n2" if spec.node == "n1" else "n1"
            forged = ShardReport(spec, ShardState.SERVING, "http://attacker:6666", None, ())
            exited = ShardReport(spec, ShardState.EXITED, None, 1, ())
            for report in (forged, exited):
                # with its own name and the victim's shard, and with the victim's name
                for node in (other, spec.node):
                    r = await f.client.post(
                        "/v1/agents/heartbeat",
                        json=heartbeat(node, report),
                        headers=f.auth(f.nodes[other]),
                    )
                    assert r.status_code == 403, r.text
            r = await f.client.post(
                "/v1/agents/register",
                json=NodeRegisteredW.from_core(
                    NodeRegistered(node_info(spec.node), (forged,), incarnation=2),
                    "http://attacker",
                ).model_dump(mode="json"),
                headers=f.auth(f.nodes[other]),
            )
            assert r.status_code == 403
            [after] = (await f.state())["replicas"]
            assert after["state"] == "ready"
            assert after["endpoint"] == before["endpoint"] == f"http://engine-{spec.node}:8000"
            assert after["shards"] == before["shards"]

    asyncio.run(go())


def test_commands_go_only_to_the_address_bound_to_the_credential_with_its_token(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        async with fleet(tmp_path) as f:
            await f.onboard("n1")
            # a registration naming another address cannot redirect the commands
            assert await f.register("n1", f.nodes["n1"], url="http://attacker") == 200
            r = await f.client.put("/v1/admin/profiles/tiny", json=PROFILE, headers=f.auth(f.admin))
            deployment = {"profile": "tiny", "replicas": 1}
            r = await f.client.put(
                "/v1/admin/deployments/tiny", json=deployment, headers=f.auth(f.admin)
            )
            assert r.is_success

            async def sent() -> list[Any] | None:
                got = [s for s in f.sent if s[1] == "/v1/assign"]
                return got or None

            for host, _, _, authorization in await eventually(sent, 5, "an assignment sent"):
                assert host == "agent-n1"
                assert authorization == f"Bearer {f.controller_tokens['n1']}"
            state = await f.state()
            assert state["nodes"][0]["agent_url"] == "http://agent-n1"
            assert state["credentials"] == [
                {
                    "node": "n1",
                    "agent_url": "http://agent-n1",
                    "issued_ms": state["credentials"][0]["issued_ms"],
                }
            ]

    asyncio.run(go())


def test_rotation_and_revocation_take_effect_at_once_and_survive_a_restart(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        async with fleet(tmp_path) as f:
            first = await f.onboard("n1")
            second = await f.onboard("n1")  # rotation
            assert first["token"] != second["token"]
            assert first["controller_token"] != second["controller_token"]
            assert await f.register("n1", first["token"]) == 401
            assert await f.register("n1", second["token"]) == 200
            admin, key = f.admin, f.runtime.settings.auth
        # the store keeps the hash only, and a restarted controller knows the credential
        with sqlite3.connect(tmp_path / "c.db") as db:
            rows = db.execute("SELECT node, token_sha256 FROM node_credentials").fetchall()
        assert rows == [("n1", token_hash(second["token"]))]
        assert second["token"].encode() not in (tmp_path / "c.db").read_bytes()
        assert key is not None and oct(key.secret_file.stat().st_mode & 0o777) == "0o600"
        settings = ControllerSettings(
            "127.0.0.1", 0, str(tmp_path / "c.db"), FAST, (), (), auth=key
        )
        runtime = ControllerRuntime(
            settings, agent_transport=httpx.MockTransport(lambda _: httpx.Response(200))
        )
        await runtime.start()
        try:
            transport = httpx.ASGITransport(app=create_controller_app(runtime))
            async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
                g = Fleet(runtime, client, admin, "")
                assert await g.register("n1", second["token"]) == 200
                cred = runtime.keys.node("n1") if runtime.keys else None
                assert cred is not None
                assert runtime.keys is not None
                assert runtime.keys.controller_token(cred) == second["controller_token"]
                r = await client.delete("/v1/admin/nodes/n1/credential", headers=g.auth(admin))
                assert r.json() == {"node": "n1", "revoked": True}
                assert await g.register("n1", second["token"]) == 401
                r = await client.delete("/v1/admin/nodes/n1/credential", headers=g.auth(admin))
                assert r.status_code == 404
        finally:
            await runtime.stop()

    asyncio.run(go())


# --- the agent ----------------------------------------------------------------------------------


def test_every_agent_endpoint_asks_for_the_controller_token_of_this_node(tmp_path: Path) -> None:
    mine, theirs = new_token(), new_token()
    CredentialFile("n1", new_token(), mine).write(tmp_path / "n1.cred")
    (tmp_path / "root").mkdir()
    (tmp_path / "agent.yaml").write_text(
        "node: n1\ncontroller: http://controller\nlisten: {port: 8100}\nroot: root\n"
        "fabric: ib-a\nports: {first: 30000, last: 30010}\ncredential: n1.cred\n"
    )
    settings = load_agent_config(tmp_path / "agent.yaml")
    assert settings.credential == tmp_path / "n1.cred"

    async def go() -> None:
        runtime = AgentRuntime(
            settings,
            info=node_info("n1"),
            controller_transport=httpx.MockTransport(lambda _: httpx.Response(200, json={})),
        )
        app = create_agent_app(runtime)
        assign = {"node": "n1", "shards": []}
        calls = [("POST", "/v1/assign", assign), ("POST", "/v1/report-request", {"node": "n1"})]
        calls.append(("GET", "/v1/state", None))
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://agent"
        ) as c:
            await runtime.start()
            try:
                for method, path, body in calls:
                    for headers, status in [
                        ({}, 401),
                        ({"authorization": f"Bearer {theirs}"}, 401),
                        ({"authorization": f"Basic {mine}"}, 401),
                        ({"authorization": f"Bearer {mine}"}, 200),
                    ]:
                        r = await c.request(method, path, json=body, headers=headers)
                        assert r.status_code == status, (path, headers, r.text)
                assert (await c.get("/health")).status_code == 200
            finally:
                await runtime.stop()

    asyncio.run(go())


def test_an_agent_refuses_a_credential_of_another_node(tmp_path: Path) -> None:
    CredentialFile("n2", new_token(), new_token()).write(tmp_path / "n.cred")
    (tmp_path / "root").mkdir()
    (tmp_path / "agent.yaml").write_text(
        "node: n1\ncontroller: http://controller\nlisten: {port: 8100}\nroot: root\n"
        "fabric: ib-a\nports: {first: 30000, last: 30010}\ncredential: n.cred\n"
    )
    settings = load_agent_config(tmp_path / "agent.yaml")
    with pytest.raises(ValueError, match="the credential is node n2's"):
        AgentRuntime(settings, info=node_info("n1"))
    assert replace(settings, credential=None).credential is None


# --- what the configs demand ------------------------------------------------------------------

HASH = token_hash("lgw_example")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("listen: {host: 0.0.0.0, port: 8080}\n", "is not a loopback address, so it needs an auth"),
        (
            f"listen: {{host: 10.1.2.3, port: 8080}}\nauth: {{admin_tokens: ['{HASH}']}}\n",
            "needs TLS (cert and key), or listen.allow_plaintext: true",
        ),
        ("listen: {port: 8080}\nauth: {admin_tokens: []}\n", "at least one admin token hash"),
        (
            "listen: {port: 8080}\nauth: {admin_tokens: [lgw_a_token_not_its_hash]}\n",
            "auth.admin_tokens[0]: expected a token hash sha256:",
        ),
        (
            f"listen: {{port: 8080}}\nauth: {{admin_tokens: ['{HASH}'], api_keys: [x]}}\n",
            "auth.api_keys[0]: expected a token hash",
        ),
    ],
)
def test_a_controller_config_that_would_open_the_fleet_is_refused(
    tmp_path: Path, extra: str, message: str
) -> None:
    from llmgw_twin.service.common.config import ConfigError
    from llmgw_twin.service.controller.config import load_controller_config

    (tmp_path / "c.yaml").write_text("store: c.db\n" + extra)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_controller_config(tmp_path / "c.yaml")


def test_a_controller_config_on_another_address_with_auth_and_tls_or_explicit_plaintext(
    tmp_path: Path,
) -> None:
    from llmgw_twin.service.controller.config import load_controller_config

    auth = f"auth: {{admin_tokens: ['{HASH}']}}\n"
    write_certificate(tmp_path / "c.pem", tmp_path / "c.key")
    (tmp_path / "c.yaml").write_text(
        "store: c.db\nlisten: {host: 10.1.2.3, port: 8080, tls: {cert: c.pem, key: c.key}}\n" + auth
    )
    s = load_controller_config(tmp_path / "c.yaml")
    assert s.tls is not None and s.tls.cert == tmp_path / "c.pem" and s.tls.client_ca is None
    assert s.auth is not None and s.auth.admin_hashes == (HASH,) and s.auth.api_key_hashes == ()
    assert s.auth.secret_file == Path(str(tmp_path / "c.db") + ".key")
    (tmp_path / "c.yaml").write_text(
        "store: c.db\nlisten: {host: 10.1.2.3, port: 8080, allow_plaintext: true}\n" + auth
    )
    assert load_controller_config(tmp_path / "c.yaml").tls is None


def write_certificate(cert: Path, key: Path) -> None:
    """A certificate and its key, as a config's TLS names them (they are read when it is)."""
    issued = trustme.CA().issue_cert("10.1.2.3")
    issued.cert_chain_pems[0].write_to_path(cert)
    issued.private_key_pem.write_to_path(key)


def test_an_agent_on_another_address_needs_a_credential(tmp_path: Path) -> None:
    from llmgw_twin.service.common.config import ConfigError

    base = "node: n1\ncontroller: http://c\nroot: /\nfabric: ib-a\nports: {first: 1, last: 2}\n"
    (tmp_path / "a.yaml").write_text(base + "listen: {host: 0.0.0.0, port: 8100}\n")
    with pytest.raises(ConfigError, match="so it needs a credential"):
        load_agent_config(tmp_path / "a.yaml")
    write_certificate(tmp_path / "a", tmp_path / "b")
    (tmp_path / "a.yaml").write_text(
        base + "credential: n1.cred\nlisten: {host: 0.0.0.0, port: 8100, tls: {cert: a, key: b}}\n"
    )
    s = load_agent_config(tmp_path / "a.yaml")
    assert s.credential == tmp_path / "n1.cred" and s.advertise_url == "https://0.0.0.0:8100"


def test_a_credential_is_bound_only_to_an_address_the_controller_can_call(tmp_path: Path) -> None:
    async def go() -> None:
        async with fleet(tmp_path) as f:
            for url in ("http://agent\x17n1", "ftp://agent-n1", "http://", "x" * 600):
                r = await f.client.post(
                    "/v1/admin/nodes/n1/credential",
                    json={"agent_url": url},
                    headers=f.auth(f.admin),
                )
                assert r.status_code == 422, (url, r.text)
            assert f.runtime.keys is not None and f.runtime.keys.nodes() == ()

    asyncio.run(go())
