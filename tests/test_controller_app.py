"""The controller service through `httpx.ASGITransport`: agents register and heartbeat, the operator
deploys, the state and events read back, commands reach agents only after the store has them,
the router proxies to a ready replica; bad input is a 422 with a message, never a 500."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from helpers.services import FAST, eventually, node_info
from llmgw_twin.control.model import ShardReport, ShardSpec, ShardState
from llmgw_twin.control.protocol import Heartbeat, NodeRegistered
from llmgw_twin.service.common.wire import HeartbeatW, NodeRegisteredW, ShardSpecW
from llmgw_twin.service.controller.app import ControllerRuntime
from llmgw_twin.service.controller.config import ControllerSettings
from llmgw_twin.service.controller.routes import create_controller_app

PROFILE = {"engine": "sim", "nodes": 2, "gpus_per_node": 2, "model": "/models/tiny"}
Agents = list[tuple[str, dict[str, Any]]]


def settings(tmp_path: Path) -> ControllerSettings:
    return ControllerSettings("127.0.0.1", 0, str(tmp_path / "c.db"), FAST, (), ())


@asynccontextmanager
async def controller(
    tmp_path: Path, agents: Agents | None = None, engine: httpx.MockTransport | None = None
) -> AsyncIterator[tuple[ControllerRuntime, httpx.AsyncClient]]:
    """A started runtime, its app on an ASGI client; agent posts are recorded in `agents`, each
    with the replica ids the store held when it arrived."""
    db = tmp_path / "c.db"

    def agent(request: httpx.Request) -> httpx.Response:
        with sqlite3.connect(db) as conn:
            stored = [r[0] for r in conn.execute("SELECT id FROM replicas ORDER BY id")]
        body = json.loads(request.content)
        if agents is not None:
            agents.append((request.url.path, body | {"_stored": stored}))
        return httpx.Response(200, json={"ok": True})

    runtime = ControllerRuntime(
        settings(tmp_path), agent_transport=httpx.MockTransport(agent), engine_transport=engine
    )
    await runtime.start()
    transport = httpx.ASGITransport(app=create_controller_app(runtime))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://controller") as client:
            yield runtime, client
    finally:
        await runtime.stop()


def registration(name: str, fabric: str = "ib-a", url: str | None = None) -> dict[str, Any]:
    msg = NodeRegistered(node_info(name, fabric), (), incarnation=1)
    return NodeRegisteredW.from_core(msg, url or f"http://agent-{name}").model_dump(mode="json")


async def deploy(client: httpx.AsyncClient, replicas: int = 1) -> None:
    r = await client.put("/v1/admin/profiles/tiny-2n", json=PROFILE)
    assert r.status_code == 200, r.text
    r = await client.put(
        "/v1/admin/deployments/tiny", json={"profile": "tiny-2n", "replicas": replicas}
    )
    assert r.status_code == 200, r.text


async def state(client: httpx.AsyncClient) -> dict[str, Any]:
    r = await client.get("/v1/admin/state")
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def test_register_heartbeat_and_state(tmp_path: Path) -> None:
    async def go() -> None:
        async with controller(tmp_path) as (_, client):
            for name in ("n1", "n2"):
                r = await client.post("/v1/agents/register", json=registration(name))
                assert r.status_code == 200 and r.json() == {"report": False}
            beat = HeartbeatW.from_core(Heartbeat(node_info("n1").node)).model_dump(mode="json")
            r = await client.post("/v1/agents/heartbeat", json=beat)
            assert r.status_code == 200 and r.json() == {"report": False}
            s = await state(client)
            assert [(n["node"], n["state"], n["fabric"]) for n in s["nodes"]] == [
                ("n1", "alive", "ib-a"),
                ("n2", "alive", "ib-a"),
            ]
            assert s["nodes"][0]["agent_url"] == "http://agent-n1"
            assert len(s["nodes"][0]["gpus"]) == 8 and s["nodes"][0]["gpus"][0]["replica"] is None
            assert s["fabrics"] == [{"fabric": "ib-a", "nodes": ["n1", "n2"]}]
            health = (await client.get("/health")).json()
            assert health["status"] == "ok" and health["nodes"] == 2

    asyncio.run(go())


def test_heartbeat_from_an_unknown_node_asks_for_a_registration_in_band(tmp_path: Path) -> None:
    async def go() -> None:
        agents: Agents = []
        async with controller(tmp_path, agents) as (_, client):
            beat = HeartbeatW.from_core(Heartbeat(node_info("n9").node)).model_dump(mode="json")
            r = await client.post("/v1/agents/heartbeat", json=beat)
            assert r.status_code == 200 and r.json() == {"report": True}
        assert agents == []  # answered in the reply, not sent to an address nobody knows

    asyncio.run(go())


def test_deploy_assigns_shards_only_after_the_store_holds_the_placement(tmp_path: Path) -> None:
    async def go() -> None:
        agents: Agents = []
        async with controller(tmp_path, agents) as (_, client):
            for name in ("n1", "n2"):
                await client.post("/v1/agents/register", json=registration(name))
            await deploy(client)

            async def assigned() -> Agents | None:
                got = [a for a in agents if a[0] == "/v1/assign" and a[1]["shards"]]
                return got if len(got) == 2 else None

            sent = await eventually(assigned, 5, "both nodes assigned a shard")
            for _, body in sent:
                assert body["_stored"] == ["tiny-r1"], "assignment sent before it was durable"
                assert body["shards"][0]["replica"] == "tiny-r1"
            assert sorted(b["node"] for _, b in sent) == ["n1", "n2"]
            s = await state(client)
            [replica] = s["replicas"]
            assert replica["state"] == "placed" and replica["fabric"] == "ib-a"
            assert replica["nodes"] == ["n1", "n2"] and replica["endpoint"] is None
            assert [sh["state"] for sh in replica["shards"]] == [None, None]
            assert s["deployments"] == [
                {"model": "tiny", "profile": "tiny-2n", "replicas": 1, "roles": []}
            ]
            held = [g for g in s["nodes"][0]["gpus"] if g["replica"] == "tiny-r1"]
            assert [g["index"] for g in held] == [0, 1]

    asyncio.run(go())


async def assignments(agents: Agents) -> list[ShardSpec]:
    """The shard specs sent to agents so far, one per (replica, rank), the latest of each."""
    specs = {}
    for path, body in agents:
        if path == "/v1/assign":
            for raw in body["shards"]:
                spec = ShardSpecW.model_validate(raw).to_core()
                specs[spec.key] = spec
    return [specs[k] for k in sorted(specs)]


def report_up(spec: ShardSpec) -> dict[str, Any]:
    """A heartbeat saying `spec` is up: the leader serving, a worker running."""
    leader = spec.rank == 0
    state_ = ShardState.SERVING if leader else ShardState.RUNNING
    endpoint = "http://engine-n1:8000" if leader else None
    report = ShardReport(spec, state_, endpoint, None, ("llmgw-twin", "sim-engine"))
    return HeartbeatW.from_core(Heartbeat(spec.node, (report,))).model_dump(mode="json")


def test_a_whole_replica_becomes_ready_and_the_router_proxies_to_it(tmp_path: Path) -> None:
    seen: list[tuple[str, bytes]] = []

    async def engine(request: httpx.Request) -> httpx.Response:
        seen.append((str(request.url), request.content))

        async def chunks() -> AsyncIterator[bytes]:
            for chunk in (b'data: {"n": 1}\n\n', b'data: {"n": 2}\n\n', b"data: [DONE]\n\n"):
                yield chunk

        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=chunks())

    async def go() -> None:
        agents: Agents = []
        async with controller(tmp_path, agents, httpx.MockTransport(engine)) as (rt, client):
            for name in ("n1", "n2"):
                await client.post("/v1/agents/register", json=registration(name))
            await deploy(client)
            chat: dict[str, Any] = {
                "model": "tiny",
                "messages": [{"role": "user", "content": "hi"}],
            }
            r = await client.post("/v1/chat/completions", json=chat)
            assert r.status_code == 503 and "no ready replica" in r.json()["detail"]
            assert r.json()["error"]["code"] == "no_ready_replica" and r.headers["retry-after"]

            async def both() -> list[ShardSpec] | None:
                specs = await assignments(agents)
                return specs if len(specs) == 2 else None

            for spec in await eventually(both, 5, "both shards assigned"):
                r = await client.post("/v1/agents/heartbeat", json=report_up(spec))
                assert r.status_code == 200, r.text

            async def ready() -> dict[str, Any] | None:
                s = await state(client)
                return s["replicas"][0] if s["replicas"][0]["state"] == "ready" else None

            replica = await eventually(ready, 5, "the replica ready")
            assert replica["endpoint"] == "http://engine-n1:8000"
            assert [sh["state"] for sh in replica["shards"]] == ["serving", "running"]
            # routes follow the events, published once the step is durable: the admin state
            # (the core's memory) may say ready a moment before

            async def routable() -> dict[str, Any] | None:
                models: dict[str, Any] = (await client.get("/v1/models")).json()
                return models if models["data"][0]["ready_replicas"] == 1 else None

            models = await eventually(routable, 5, "the replica routable")
            assert models["data"][0]["id"] == "tiny"

            chat["stream"] = True
            async with client.stream("POST", "/v1/chat/completions", json=chat) as r:
                assert r.status_code == 200
                assert r.headers["content-type"].startswith("text/event-stream")
                assert r.headers["x-llmgw-replica"] == "tiny-r1"
                body = b"".join([c async for c in r.aiter_bytes()])
            assert body.endswith(b"data: [DONE]\n\n") and body.count(b"data:") == 3
            assert seen[0][0] == "http://engine-n1:8000/v1/chat/completions"
            assert json.loads(seen[0][1]) == chat

            events = (await client.get("/v1/admin/events")).json()
            kinds = [e["kind"] for e in events["events"]]
            assert kinds.index("replica.placed") < kinds.index("replica.ready")
            assert events["next"] == len(kinds) and events["dropped"] == 0
            later = (await client.get(f"/v1/admin/events?after={len(kinds) - 1}")).json()
            assert [e["kind"] for e in later["events"]] == kinds[-1:]
            assert all(e["t_ms"] >= 0 for e in events["events"])
            assert rt.router.pick(replica["model"]) is not None
            # read two at a time, following `next`: the same log, in order
            paged: list[str] = []
            after = 0
            for _ in range(len(kinds)):
                page = (await client.get(f"/v1/admin/events?after={after}&limit=2")).json()
                assert len(page["events"]) <= 2
                if not page["events"]:
                    break
                paged += [e["kind"] for e in page["events"]]
                after = page["next"]
            assert paged == kinds[: len(paged)] and len(paged) >= len(kinds)

    asyncio.run(go())


def test_router_answers_unknown_models_and_bad_bodies_with_a_message(tmp_path: Path) -> None:
    async def go() -> None:
        async with controller(tmp_path) as (_, client):
            r = await client.post("/v1/completions", json={"model": "nope", "prompt": "x"})
            assert r.status_code == 404 and "not deployed" in r.json()["detail"]
            assert r.json()["error"]["code"] == "model_not_found"
            r = await client.post("/v1/completions", content=b"{not json")
            assert r.status_code == 400 and "not JSON" in r.json()["detail"]
            assert r.json()["error"]["code"] == "invalid_json"
            r = await client.post("/v1/chat/completions", json={"messages": []})
            assert r.status_code == 400 and "body.model" in r.json()["detail"]
            error = r.json()["error"]
            assert (error["type"], error["code"], error["param"]) == (
                "invalid_request_error",
                "model_required",
                None,
            )
            assert (await client.get("/v1/models")).json() == {"object": "list", "data": []}

    asyncio.run(go())


def test_deployment_of_an_unknown_profile_is_refused_with_a_message(tmp_path: Path) -> None:
    async def go() -> None:
        async with controller(tmp_path) as (_, client):
            r = await client.put("/v1/admin/deployments/m", json={"profile": "p", "replicas": 1})
            assert r.status_code == 422
            assert r.json()["detail"] == "deployment m: unknown profile p"
            assert (await state(client))["deployments"] == []

    asyncio.run(go())


BAD: list[tuple[str, str, Any]] = [
    ("POST", "/v1/agents/register", b"{oops"),
    ("POST", "/v1/agents/register", {"info": {"node": "n1"}}),
    ("POST", "/v1/agents/register", registration("n1") | {"incarnation": "1"}),
    ("POST", "/v1/agents/register", registration("n1") | {"agent_url": "ftp://x"}),
    ("POST", "/v1/agents/register", registration("n1") | {"extra": 1}),
    ("POST", "/v1/agents/heartbeat", b""),
    ("POST", "/v1/agents/heartbeat", {"node": "bad name!", "shards": []}),
    ("POST", "/v1/agents/heartbeat", {"node": "n1", "shards": [{"state": "serving"}]}),
    ("POST", "/v1/agents/heartbeat", [1, 2]),
    ("PUT", "/v1/admin/profiles/p", PROFILE | {"engine": "tensorrt"}),
    ("PUT", "/v1/admin/profiles/p", PROFILE | {"nodes": 0}),
    ("PUT", "/v1/admin/profiles/p", PROFILE | {"gpus_per_node": "2"}),
    ("PUT", "/v1/admin/profiles/bad%20name", PROFILE),
    ("PUT", "/v1/admin/profiles/p", b"null"),
    ("PUT", "/v1/admin/deployments/m", {"profile": "p", "replicas": -1}),
    ("PUT", "/v1/admin/deployments/m", {"profile": "p"}),
    ("PUT", "/v1/admin/deployments/m", {"profile": "p", "replicas": 1.5}),
    ("GET", "/v1/admin/events?after=-1", None),
    ("GET", "/v1/admin/events?after=x", None),
]


@pytest.mark.parametrize(("method", "path", "body"), BAD)
def test_bad_payloads_are_422_with_a_clear_message(
    tmp_path: Path, method: str, path: str, body: Any
) -> None:
    async def go() -> None:
        async with controller(tmp_path) as (_, client):
            if isinstance(body, bytes):
                headers = {"content-type": "application/json"}
                r = await client.request(method, path, content=body, headers=headers)
            elif body is None:
                r = await client.request(method, path)
            else:
                r = await client.request(method, path, json=body)
            assert r.status_code == 422, r.text
            detail = r.json()["detail"]
            assert isinstance(detail, str) and detail.startswith("invalid request: ")
            assert len(detail) > len("invalid request: ") + 5

    asyncio.run(go())


def test_a_restarted_controller_restores_from_its_store_and_asks_agents_to_report(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        async with controller(tmp_path) as (_, client):
            for name in ("n1", "n2"):
                await client.post("/v1/agents/register", json=registration(name))
            await deploy(client)

            async def placed() -> bool | None:
                replicas = (await state(client))["replicas"]
                return True if replicas and replicas[0]["nodes"] else None

            await eventually(placed, 5, "the replica placed")
        agents: Agents = []
        async with controller(tmp_path, agents) as (_, client):

            async def asked() -> Agents | None:
                got = [a for a in agents if a[0] == "/v1/report-request"]
                return got if len(got) == 2 else None

            requests = await eventually(asked, 5, "both known agents asked to report")
            assert sorted(body["node"] for _, body in requests) == ["n1", "n2"]
            s = await state(client)
            assert s["deployments"] == [
                {"model": "tiny", "profile": "tiny-2n", "replicas": 1, "roles": []}
            ]
            assert s["replicas"][0]["replica"] == "tiny-r1"
            # its agents have not answered: it waits, restored, for them or for their loss
            assert s["replicas"][0]["state"] == "adopting"

    asyncio.run(go())


def test_an_unexpected_error_in_a_handler_is_a_json_500_with_a_message(tmp_path: Path) -> None:
    async def go() -> None:
        runtime = ControllerRuntime(settings(tmp_path))
        app = create_controller_app(runtime)

        @app.get("/boom")
        async def boom() -> None:
            raise RuntimeError("the disk is on fire")

        await runtime.start()
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
                r = await client.get("/boom")
        finally:
            await runtime.stop()
        assert r.status_code == 500
        assert r.json() == {"detail": "internal error: RuntimeError: the disk is on fire"}

    asyncio.run(go())
