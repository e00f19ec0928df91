"""The router's inference routes, served ahead of the web framework.

Role: `RouterApp` is the router's FastAPI app with one thing first: an OpenAI request
(`POST` to one of `INFERENCE_PATHS`) whose caller passes the API-key check and whose body
declares a length within the inference limit goes straight to `Forwarder.forward`, without the
framework's routing, dependency solving and middleware, whose cost per request was more than
the forwarding's own (docs/performance.md, "The router"). Everything else, a refusal included
(no key, a body too large or of no declared length), takes the app's full way, so every answer
that is not a forwarded one is the app's own, in its exact words.

Invariants:
- Same checks as the full way: the same `ApiKeys.require` and the same body limit; only a
  request both admit is served here, so nothing is admitted here that the app would refuse.
- The request's body is read here only as far as it declared (the HTTP parser frames it).
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.types import ASGIApp, Receive, Scope, Send

from llmgw_twin.service.common.limits import INFERENCE_PATHS, content_length
from llmgw_twin.service.router.forwarding import Deployed, Forwarder


class _Body:
    """The request's body, read from the server when the forwarding asks for it."""

    __slots__ = ("_receive",)

    def __init__(self, receive: Receive) -> None:
        self._receive = receive

    async def body(self) -> bytes:
        parts = []
        while True:
            message = await self._receive()
            if message["type"] != "http.request":
                raise ClientDisconnect
            parts.append(message.get("body", b""))
            if not message.get("more_body", False):
                return parts[0] if len(parts) == 1 else b"".join(parts)


class FastPath:
    def __init__(
        self,
        forwarder: Forwarder,
        deployed: Deployed,
        check: Callable[[Request], object] | None,
        limit: int,
    ) -> None:
        self.forwarder = forwarder
        self.deployed = deployed
        self.check = check
        self.limit = limit

    def take(self, scope: Scope) -> ASGIApp | None:
        """The listener's lane (`common/lane.py`): this request served by `serve`, on its own
        cycle and with no middleware between, when `admits` it."""
        return self.serve if self.admits(scope) else None

    def admits(self, scope: Scope) -> bool:
        """Whether the request is one to forward here: an inference POST whose body declares
        a length within the limit, from a caller the check lets in."""
        if scope["type"] != "http" or scope["method"] != "POST":
            return False
        if scope["path"] not in INFERENCE_PATHS:
            return False
        # as `BodyLimit` reads it; a streamed body is for it to count, on the full way
        declared = content_length(scope)
        if declared is None or declared > self.limit:
            return False
        for name, _ in scope["headers"]:
            if name == b"transfer-encoding":
                return False
        if self.check is None:  # no key to ask for
            return True
        try:
            self.check(Request(scope))
        except HTTPException:
            return False
        return True

    async def serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        answer = await self.forwarder.forward(_Body(receive), scope["path"], self.deployed)
        await answer(scope, receive, send)


class RouterApp(FastAPI):
    """The router's app: inference requests through `fast` first (set once built)."""

    fast: FastPath | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        fast = self.fast
        if fast is not None and fast.admits(scope):
            await fast.serve(scope, receive, send)
            return
        await super().__call__(scope, receive, send)
