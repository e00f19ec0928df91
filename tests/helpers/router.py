"""The router service for tests: real sim-engine processes on loopback, a router app served by
uvicorn in a thread (real HTTP, so streams are streams), and a scripted controller feed naming
the engines as the replicas of one model."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import httpx
from fastapi import FastAPI

from helpers.engines import Engine
from helpers.live import live_server
from helpers.services import eventually, free_ports
from llmgw_twin.control.routing import Ejection, RouterTimeouts
from llmgw_twin.service.common.listener import DEFAULT_LISTEN_LIMITS, uvicorn_options
from llmgw_twin.service.router.app import RouterRuntime, create_router_app
from llmgw_twin.service.router.config import RouterSettings

MODEL = "m"
DEADLINE_S = 30.0


def sim_engine(token_latency_ms: int = 0, model: str = MODEL) -> tuple[Engine, str]:
    """A 1-node sim engine serving `model` on a free loopback port, once it serves; and its
    base URL. The caller closes it."""
    (port,) = free_ports(1)
    argv = (
        sys.executable,
        "-m",
        "llmgw_twin.cli",
        "sim-engine",
        "--model",
        f"/models/{model}",
        "--served-model-name",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--token-latency-ms",
        str(token_latency_ms),
    )
    engine = Engine(argv, f"sim engine :{port}")
    try:
        engine.wait_log("serving", DEADLINE_S)
    except BaseException:
        engine.close()
        raise
    return engine, f"http://127.0.0.1:{port}"


@contextmanager
def engines(*latencies_ms: int) -> Iterator[list[tuple[Engine, str]]]:
    made: list[tuple[Engine, str]] = []
    try:
        for latency in latencies_ms:
            made.append(sim_engine(latency))
        yield made
    finally:
        for engine, _ in made:
            engine.close()


def static_feed(
    endpoints: dict[str, str],
    models: tuple[str, ...] = (MODEL,),
    roles: dict[str, tuple[str, str]] | None = None,
) -> httpx.MockTransport:
    """A controller feed that names `endpoints` (replica `{model}-r{n}` -> its URL) once, with
    `models` deployed, then has no news (each later poll waits until the router stops); `roles`
    makes replicas members of role groups (replica -> its group and role)."""

    async def handler(request: httpx.Request) -> httpx.Response:
        if "epoch" in request.url.params:
            await asyncio.Event().wait()
        snapshot = [
            {"model": r.rsplit("-r", 1)[0], "replica": r, "state": "ready", "endpoint": url}
            | ({"group": roles[r][0], "role": roles[r][1]} if roles and r in roles else {})
            for r, url in sorted(endpoints.items())
        ]
        page = {
            "epoch": "e1",
            "next": 0,
            "models": list(models),
            "snapshot": snapshot,
            "events": [],
        }
        return httpx.Response(200, content=json.dumps(page).encode())

    return httpx.MockTransport(handler)


def settings(**kw: Any) -> RouterSettings:
    """Router settings for a test: short timeouts unless told otherwise."""
    base = RouterSettings(
        host="127.0.0.1",
        port=0,  # not read: `live_server` binds the port
        controller_url="http://controller.test",
        timeouts=RouterTimeouts(connect_ms=2_000, first_byte_ms=10_000, between_chunks_ms=10_000),
        ejection=Ejection(failures=3, base_ms=60_000, max_ms=60_000),
    )
    return replace(base, **kw)


@contextmanager
def router(
    s: RouterSettings, feed: httpx.AsyncBaseTransport, *, listener: bool = False
) -> Iterator[str]:
    """A router app on uvicorn over loopback, following `feed`; its base URL. `listener`: on
    the services' own listener (`listener.GuardedHttp`, as `llmgw-twin router` serves), not
    uvicorn's plain one."""

    def build() -> FastAPI:
        return create_router_app(RouterRuntime(s, controller_transport=feed))

    options = uvicorn_options(DEFAULT_LISTEN_LIMITS) if listener else None
    with live_server(build, options=options) as url:
        yield url


async def routable(client: httpx.AsyncClient, count: int, model: str = MODEL) -> None:
    """Wait until the router can pick `count` replicas of `model`."""

    async def probe() -> bool | None:
        models = (await client.get("/v1/models")).json()["data"]
        return (
            True if any(m["id"] == model and m["ready_replicas"] == count for m in models) else None
        )

    await eventually(probe, DEADLINE_S, f"{count} routable replicas of {model}")


async def state(client: httpx.AsyncClient) -> dict[str, Any]:
    r = await client.get("/v1/router/state")
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def replicas_of(s: dict[str, Any], model: str = MODEL) -> dict[str, dict[str, Any]]:
    for m in s["models"]:
        if m["model"] == model:
            return {r["replica"]: r for r in m["replicas"]}
    return {}


async def events(response: httpx.Response) -> AsyncIterator[str]:
    """The `data:` payloads of a server-sent event stream, as they arrive."""
    async for line in response.aiter_lines():
        if line.startswith("data: "):
            yield line.removeprefix("data: ")


def chat(content: str = "hello", **kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **kw}
