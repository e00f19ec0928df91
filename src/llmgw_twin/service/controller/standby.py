"""A standby answers: every call to a controller that does not lead says where the leader is.

Role: the controller's lifespan (`lifespan`) serves from the moment the process starts and
claims the lease in the background (`ControllerRuntime.start` waits there while another leads),
so a standby's port accepts instead of holding its clients in the backlog until their timeouts.
In front of everything else, `StandbyGate` answers while this controller waits for the lease:
`GET /health` with 200 and `"status": "standby"` (the process is up), every other call with 503,
`Retry-After: 1`, and a body naming the leader as the store last said it (`leader`: name, epoch
and the address it said it is reached at), so an agent or a router given every controller's
address goes on to the next one at once and `ctl` can name (or follow) the leader. From the
moment it leads the gate lets everything through; until its state is restored, calls answer
503 "the controller is not running" as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

if TYPE_CHECKING:
    from llmgw_twin.service.controller.app import ControllerRuntime

log = logging.getLogger("llmgw_twin.controller")

RETRY_AFTER_S = 1


def leader_of(runtime: ControllerRuntime) -> dict[str, Any] | None:
    view = runtime.leadership.leader
    if view is None:
        return None
    return {"name": view.name, "epoch": view.epoch, "url": view.url}


def standby_message(runtime: ControllerRuntime) -> str:
    me = runtime.leadership.name
    leader = leader_of(runtime)
    if leader is None:
        return f"controller {me} is a standby: no leader is known yet (it is claiming the lease)"
    where = f" at {leader['url']}" if leader["url"] else ""
    return f"controller {me} is a standby: {leader['name']} leads in epoch {leader['epoch']}{where}"


class StandbyGate:
    """ASGI middleware: while the controller does not lead, answer here (see the module)."""

    def __init__(self, app: ASGIApp, runtime: ControllerRuntime) -> None:
        self.app = app
        self.runtime = runtime

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.runtime.leadership.standing_by:
            await self.app(scope, receive, send)
            return
        leader = leader_of(self.runtime)
        if scope["path"] == "/health" and scope["method"] in ("GET", "HEAD"):
            status = 200
            body: dict[str, Any] = {
                "status": "standby",
                "controller": self.runtime.leadership.name,
                "leader": leader,
            }
        else:
            status = 503
            body = {"detail": standby_message(self.runtime), "leader": leader}
        reply = JSONResponse(body, status_code=status, headers={"retry-after": str(RETRY_AFTER_S)})
        await reply(scope, receive, send)


def lifespan(runtime: ControllerRuntime) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The controller app's lifespan: serving at once, leading once the lease is ours (the
    start in the background); stopped after the last request."""

    @asynccontextmanager
    async def span(_app: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(_lead(runtime))
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await runtime.stop()

    return span


async def _lead(runtime: ControllerRuntime) -> None:
    try:
        await runtime.start()
    except asyncio.CancelledError:
        raise
    except Exception as e:  # a start that failed leaves a process that can never lead
        log.exception("the controller failed to start")
        runtime.fail(f"the controller failed to start: {e!r}")
