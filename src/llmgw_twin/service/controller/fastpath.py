"""The heartbeat's short way through the controller: what every node sends every few seconds
costs as little as a request can.

Role: an ASGI layer between the body limit and FastAPI. A `POST /v1/agents/heartbeat` whose
credential is a node's own, whose body is JSON that `HeartbeatW` accepts, is read with pydantic's
JSON validator straight from the bytes, handed to the runtime and answered here, without
FastAPI's routing, dependency solving and response rendering, which cost more than everything
else a heartbeat does (docs/performance.md). A body that is byte for byte the node's last one
(a steady node's heartbeats are) is not read again: its message is the last one's. Anything
else (another path, a missing or wrong credential, a body that does not validate, a content
type other than JSON) goes on to FastAPI untouched, which answers it exactly as it always has:
refusals keep their status, message, headers and log line, and the OpenAPI schema still
describes the route.

Invariants: a request the short way answers gets the status, headers and body the FastAPI route
would give it (`tests/test_fastpath.py` compares them); the body it reads is the one the body
limit already read and bounded.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from llmgw_twin.control.protocol import Heartbeat
from llmgw_twin.service.common.auth import Caller, bearer_of
from llmgw_twin.service.common.limits import replaying
from llmgw_twin.service.common.wire import HeartbeatW, Refused, ReportReplyW

if TYPE_CHECKING:
    from llmgw_twin.service.controller.app import ControllerRuntime

PATH = "/v1/agents/heartbeat"
_JSON = b"application/json"
_QUIET = ReportReplyW(report=False).model_dump_json().encode()
_ASKS = ReportReplyW(report=True).model_dump_json().encode()


class HeartbeatFastPath:
    def __init__(self, app: ASGIApp, runtime: ControllerRuntime) -> None:
        self.app = app
        self.runtime = runtime
        self.answered = 0
        """Heartbeats answered here (the rest went on to FastAPI)."""
        self._last: dict[str, tuple[bytes, Heartbeat]] = {}
        """Each node's last heartbeat body and its message: a node sends the same bytes beat
        after beat until something changes, and they need reading only once. One entry per
        credential, so bounded by the fleet; without credentials nothing is kept."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        authorization, content_type = _headers(scope)
        started = time.perf_counter()
        ours, caller = self._caller(authorization)
        if not ours or content_type is None or not content_type.startswith(_JSON):
            await self.app(scope, receive, send)
            return
        body, replay = await _read(receive)
        if body is None:
            return  # the client went away
        node = caller.node if caller is not None else None
        last = self._last.get(node) if node is not None else None
        if last is not None and last[0] == body:
            heartbeat = last[1]  # the same bytes as this node's last: the same message
        else:
            try:
                heartbeat = HeartbeatW.model_validate_json(body).to_core()
            except ValidationError:
                await self.app(scope, replay, send)  # FastAPI says what is wrong, as ever
                return
            if node is not None:
                self._last[node] = (body, heartbeat)
        try:
            asks = await self.runtime.heard(heartbeat, caller)
        except Refused as e:  # another node's shards, say: as `wire.install_error_handlers`
            await _answer(send, e.status, {"detail": str(e)})
            return
        except HTTPException as e:
            await _answer(send, e.status_code, {"detail": str(e.detail)}, e.headers)
            return
        self.answered += 1
        await _answer(send, 200, _ASKS if asks else _QUIET)
        self.runtime.histograms.heartbeat.observe(time.perf_counter() - started)

    def _caller(self, authorization: bytes | None) -> tuple[bool, Caller | None]:
        """Whether the credential lets this request through (else FastAPI refuses it), and
        the node it is (None when the controller asks no credentials)."""
        keys = self.runtime.keys
        if keys is None:
            return True, None
        token = bearer_of(None if authorization is None else authorization.decode("latin-1"))
        if token is None:
            return False, None
        caller = keys.identify(token)
        if caller is None or caller.kind != "node":
            return False, None
        return True, caller


async def _answer(
    send: Send, status: int, body: bytes | dict[str, str], headers: Mapping[str, str] | None = None
) -> None:
    payload = (
        body
        if isinstance(body, bytes)
        else json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    )
    raw = [(b"content-length", str(len(payload)).encode()), (b"content-type", _JSON)]
    raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})


def _headers(scope: Scope) -> tuple[bytes | None, bytes | None]:
    """The first `authorization` and `content-type` headers, as a request's headers read."""
    authorization = content_type = None
    for raw, value in scope["headers"]:
        name = raw.lower()
        if name == b"authorization" and authorization is None:
            authorization = value
        elif name == b"content-type" and content_type is None:
            content_type = value.lower()
    return authorization, content_type


async def _read(receive: Receive) -> tuple[bytes | None, Receive]:
    """The whole body (the body limit has bounded it), and a `receive` that gives it again."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None, receive
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body = b"".join(chunks)
    return body, replaying(body, receive)
