"""A controller for limit and bound tests: its commands to agents recorded, its app on an ASGI
client, and two replicas made ready by reporting their shards serving."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from helpers.services import FAST, eventually, node_info
from llmgw_twin.control.model import ShardReport, ShardSpec, ShardState, Timings
from llmgw_twin.control.protocol import Heartbeat, NodeRegistered
from llmgw_twin.service.common.wire import HeartbeatW, NodeRegisteredW, ShardSpecW
from llmgw_twin.service.controller.app import ControllerRuntime
from llmgw_twin.service.controller.config import ControllerSettings
from llmgw_twin.service.controller.routes import create_controller_app

Sent = list[tuple[str, Any]]
"""(path, body) of every command the controller sent an agent."""
PROFILE: dict[str, Any] = {"engine": "sim", "gpus_per_node": 1, "model": "/models/tiny"}
CHAT_MODEL = "tiny"


def runtime_of(
    tmp_path: Path,
    sent: Sent | None = None,
    engine: httpx.AsyncBaseTransport | None = None,
    timings: Timings = FAST,
) -> ControllerRuntime:
    def agent(request: httpx.Request) -> httpx.Response:
        if sent is not None:
            sent.append((request.url.path, json.loads(request.content)))
        return httpx.Response(200, json={"ok": True})

    settings = ControllerSettings("127.0.0.1", 0, str(tmp_path / "c.db"), timings, (), ())
    return ControllerRuntime(
        settings, agent_transport=httpx.MockTransport(agent), engine_transport=engine
    )


@asynccontextmanager
async def controller(
    tmp_path: Path, sent: Sent | None = None, engine: httpx.AsyncBaseTransport | None = None
) -> AsyncIterator[tuple[ControllerRuntime, httpx.AsyncClient]]:
    """A started runtime, its app on an ASGI client."""
    runtime = runtime_of(tmp_path, sent, engine)
    await runtime.start()
    transport = httpx.ASGITransport(app=create_controller_app(runtime))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://c", timeout=30) as c:
            yield runtime, c
    finally:
        await runtime.stop()


def registration(name: str = "n1", **info: Any) -> dict[str, Any]:
    """A registration of `name` (8 GPUs, the sim engine), its `info` fields replaced."""
    msg = NodeRegistered(node_info(name), (), incarnation=1)
    body = NodeRegisteredW.from_core(msg, f"http://agent-{name}").model_dump(mode="json")
    body["info"] |= info
    return body


def assigned_specs(sent: Sent) -> list[ShardSpec]:
    """Every shard the controller's assignments named so far, once each (the latest spec)."""
    specs = {}
    for path, body in sent:
        if path == "/v1/assign":
            for raw in body["shards"]:
                spec = ShardSpecW.model_validate(raw).to_core()
                specs[spec.key] = spec
    return list(specs.values())


async def two_ready_replicas(
    client: httpx.AsyncClient, sent: Sent, endpoint: str | None = None
) -> list[str]:
    """Two 1-GPU replicas of `CHAT_MODEL` on nodes n1 and n2, reported serving, each leader at
    `endpoint` (default `http://engine-{replica}:8000`); their ids, once both are routable."""
    for name in ("n1", "n2"):
        r = await client.post("/v1/agents/register", json=registration(name))
        assert r.status_code == 200, r.text
    r = await client.put("/v1/admin/profiles/tiny", json=PROFILE)
    assert r.status_code == 200, r.text
    r = await client.put("/v1/admin/deployments/tiny", json={"profile": "tiny", "replicas": 2})
    assert r.status_code == 200, r.text

    async def assigned() -> list[ShardSpec] | None:
        specs = assigned_specs(sent)
        return specs if len(specs) == 2 else None

    for spec in await eventually(assigned, 5, "both replicas assigned"):
        url = endpoint or f"http://engine-{spec.replica}:8000"
        up = ShardReport(spec, ShardState.SERVING, url, None, ())
        beat = HeartbeatW.from_core(Heartbeat(spec.node, (up,))).model_dump(mode="json")
        r = await client.post("/v1/agents/heartbeat", json=beat)
        assert r.status_code == 200, r.text

    async def ready() -> list[str] | None:
        # routable in the core's state, and published: the controller's router follows the
        # event log as each event is published, after its step's commit, so a state that says
        # routable can be a commit ahead of what a request is routed by
        replicas = (await client.get("/v1/admin/state")).json()["replicas"]
        up = sorted(x["replica"] for x in replicas if x["routable"])
        page = (await client.get("/v1/admin/events", params={"after": 0})).json()
        published = {
            e["subjects"]["replica"] for e in page["events"] if e["kind"] == "replica.ready"
        }
        return up if len(up) == 2 and set(up) <= published else None

    return await eventually(ready, 5, "both replicas routable")
