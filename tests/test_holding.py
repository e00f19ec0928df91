"""Requests held for a model scaled to zero (`service/router/holding.py`), through the router
service on loopback against a real sim-engine process: the request waits until a replica of the
model is routable and is then answered by it; the router tells the controller it holds a
request at once (its load push carries `held`), not at the next push interval; a hold that runs
out is a 503 that says so; a model not marked held is refused at once, as before.

The controller is a scripted feed (`httpx.MockTransport`): its first page deploys the model with
no replica, marked `holding`, and the next page, given only once the test has seen the held
push, makes the engine its replica.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import httpx

from helpers.router import MODEL, chat, engines, router, settings
from helpers.services import eventually
from llmgw_twin.service.router.forwarding import REPLICA_HEADER

WAIT_S = 30.0
"""The longest the scripted feed waits for the test (a bounded loop)."""


class ScriptedController:
    def __init__(self, endpoint: str | None, holding: tuple[str, ...] = (MODEL,)) -> None:
        self.endpoint = endpoint
        self.holding = list(holding)
        self.release = threading.Event()
        self.pushes: list[dict[str, Any]] = []

    def page(self, events: list[dict[str, Any]], snapshot: list[Any] | None) -> httpx.Response:
        page = {
            "epoch": "e1",
            "next": len(events),
            "models": [MODEL],
            "holding": self.holding,
            "snapshot": snapshot,
            "events": events,
        }
        return httpx.Response(200, content=json.dumps(page).encode())

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/router/load":
            self.pushes.append(json.loads(request.content))
            return httpx.Response(200, json={"accepted": True, "routers": 1})
        if "epoch" not in request.url.params:
            return self.page([], [])
        if request.url.params["after"] != "0" or self.endpoint is None:
            await asyncio.Event().wait()  # no more news
        for _ in range(int(WAIT_S / 0.01)):
            if self.release.is_set():
                break
            await asyncio.sleep(0.01)
        join = {
            "t_ms": 1,
            "kind": "replica.ready",
            "model": MODEL,
            "replica": f"{MODEL}-r1",
            "endpoint": self.endpoint,
            "ready": True,
        }
        return self.page([join], None)

    def held_pushed(self) -> bool:
        return any(p.get("held", {}).get(MODEL) == 1 for p in self.pushes)


def _client(base: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=base, timeout=60.0, trust_env=False)


def test_a_request_for_a_model_at_zero_waits_for_its_first_replica_and_is_answered() -> None:
    with engines(0) as [(_, url)]:
        ctl = ScriptedController(url)
        # pushes every hour: the held push below can only be the one a hold makes at once
        s = settings(load_push_ms=3_600_000)
        feed = httpx.MockTransport(ctl.handle)
        with router(s, feed) as base:

            async def go() -> None:
                async with _client(base) as c:
                    asked = asyncio.ensure_future(c.post("/v1/chat/completions", json=chat()))

                    async def pushed() -> bool | None:
                        return True if ctl.held_pushed() else None

                    await eventually(pushed, WAIT_S, "the router's push of its held request")
                    assert not asked.done()  # held, not refused
                    state = (await c.get("/v1/router/state")).json()
                    assert state["holds"]["held"] == {MODEL: 1}
                    ctl.release.set()
                    r = await asked
                    assert r.status_code == 200, r.text
                    assert r.headers[REPLICA_HEADER] == f"{MODEL}-r1"
                    state = (await c.get("/v1/router/state")).json()
                    assert state["holds"] == {"held": {}, "released": 1, "expired": 0}

            asyncio.run(go())


def test_a_hold_that_runs_out_is_a_503_that_says_the_model_is_starting() -> None:
    ctl = ScriptedController(None)
    with router(settings(hold_at_zero_ms=300), httpx.MockTransport(ctl.handle)) as base:

        async def go() -> None:
            async with _client(base) as c:
                r = await c.post("/v1/chat/completions", json=chat())
                assert r.status_code == 503 and r.headers["retry-after"] == "5"
                error = r.json()["error"]
                assert error["code"] == "not_started"
                assert "scaled to zero" in error["message"] and "0.3s" in error["message"]
                state = (await c.get("/v1/router/state")).json()
                assert state["holds"] == {"held": {}, "released": 0, "expired": 1}

        asyncio.run(go())


def test_a_model_not_held_at_zero_is_refused_at_once_as_before() -> None:
    ctl = ScriptedController(None, holding=())
    with router(settings(hold_at_zero_ms=600_000), httpx.MockTransport(ctl.handle)) as base:

        async def go() -> None:
            async with _client(base) as c:
                r = await c.post("/v1/chat/completions", json=chat())
                assert r.status_code == 503
                assert r.json()["error"]["code"] == "no_ready_replica"
                assert not ctl.held_pushed()

        asyncio.run(go())
