"""What the forwarding answers a client with: a replica's answer read whole, or relayed.

Role: `forwarding.Forwarder` returns one of these (or an error of its own, `replies`). `Whole`
is a replica's answer read to its end before any of it leaves; `Relay` passes a streamed 2xx
answer on chunk by chunk as it comes, never buffered, and however it ends (done, cut, stalled,
the client gone) the replica's connection is given back or closed and the pick judged. Both
are ASGI apps (starlette responses), as a FastAPI route or the router's fast path send them.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Protocol

from starlette.responses import Response, StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from llmgw_twin.control.model import ReplicaId
from llmgw_twin.service.common.listener import GONE, Gone
from llmgw_twin.service.router.request_metrics import ReplicaAnswer
from llmgw_twin.service.router.upstream import UpstreamError

if TYPE_CHECKING:
    from llmgw_twin.service.router.forwarding import Forwarder, Pick

log = logging.getLogger("llmgw_twin.forwarding")

REPLICA_HEADER = "x-llmgw-replica"
RETRIED_HEADER = "x-llmgw-retried"
_REPLICA = REPLICA_HEADER.encode("latin-1")
_RETRIED = RETRIED_HEADER.encode("latin-1")


class Answer(Protocol):
    """A replica's answer as a client to the replicas gives it (`upstream.py`)."""

    status: int
    content_type: str | None

    @property
    def is_success(self) -> bool: ...

    @property
    def ended(self) -> bool:
        """The whole body arrived and was taken (False where that is not known ahead)."""
        ...

    async def next_chunk(self, timeout_s: float | None = None) -> bytes | None: ...

    async def aclose(self) -> None: ...


def error_event(message: str, code: str) -> bytes:
    """The last event of a stream cut midway, in the shape OpenAI clients read."""
    error = {"message": message, "type": "server_error", "code": code, "param": None}
    return b"data: " + json.dumps({"error": error}).encode() + b"\n\n"


def tag(response: Response, replica: ReplicaId, retried: bool) -> Response:
    """`response` names the replica that answered it (and that it was retried): headers
    added to its raw list, which its `headers` view shares (the forwarding's answers carry
    neither header before)."""
    raw = response.raw_headers
    raw.append((_REPLICA, replica.encode("latin-1")))
    if retried:
        raw.append((_RETRIED, b"1"))
    return response


def tagged(response: Response) -> bool:
    """Whether `tag` named a replica on `response`: a replica was sent the request."""
    return any(name == _REPLICA for name, _ in response.raw_headers)


def content_type(answer: Answer) -> dict[str, str]:
    return {} if answer.content_type is None else {"content-type": answer.content_type}


class Whole(ReplicaAnswer, Response):
    """A replica's own answer, read whole: its status, its content type and its body, with the
    headers starlette's `Response` would give them (the content type, then the length where
    the status has a body), made here at once."""

    def __init__(self, body: bytes, status_code: int, content_type: str | None) -> None:
        self.status_code = status_code
        self.body = body
        self.background = None
        raw = [] if content_type is None else [(b"content-type", content_type.encode("latin-1"))]
        if not (status_code < 200 or status_code in (204, 304)):
            raw.append((b"content-length", str(len(body)).encode("latin-1")))
        self.raw_headers = raw


class Relay(ReplicaAnswer, StreamingResponse):
    """A replica's streamed answer, passed on as it comes: each read sends what arrived since
    the last one. A plain ASGI loop rather than starlette's (which runs a task group per
    response to hear of a client gone): here one task waits for the client's disconnect and
    cancels the relay, which then ends quietly."""

    streamed = True

    def __init__(self, forwarder: Forwarder, pick: Pick, answer: Answer, first: bytes) -> None:
        headers = content_type(answer)
        super().__init__(iter(()), status_code=answer.status, headers=headers)
        self._forwarder = forwarder
        self._pick = pick
        self._answer = answer
        self._first = first

    async def _relay(self, send: Send) -> None:
        answer = self._answer
        between_ms = self._forwarder.timeouts.between_chunks_ms
        piece = self._first
        while True:
            # a piece that is the answer's last goes out with the end of the answer, in one write
            last = answer.ended
            await send(_body(piece, more=not last))
            if last:
                return
            try:
                got = await answer.next_chunk(between_ms / 1000)
            except TimeoutError:
                message = f"the replica sent nothing for {between_ms} ms"
                return await self._cut(send, message, "upstream_timeout")
            except UpstreamError as e:
                return await self._cut(send, f"the replica cut its answer: {e}", "upstream_cut")
            if got is None:
                return await send(_body(b"", more=False))
            piece = got

    async def _cut(self, send: Send, message: str, code: str) -> None:
        """The stream broke midway: it ends with one error event."""
        self._forwarder.cut += 1
        # judged before the client hears of the cut, so that whoever reads the router's state
        # after the error event finds the replica's slot already given back
        self._pick.finish(ok=False)
        replica = self._pick.route.replica
        log.warning("stream from replica %s cut midway: %s", replica, message)
        await send(_body(error_event(f"replica {replica}: {message}", code), more=False))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        left = False

        def went() -> None:
            nonlocal left
            left = True
            task.cancel()

        # told by the listener when the client's connection is lost (`listener.Gone`); under
        # another server, by a task of its own waiting for the disconnect
        hook = ((scope.get("extensions") or {}).get(GONE) or {}).get("connection")
        if isinstance(hook, Gone):
            hook.add(went)
        else:
            hook = None
            watch = asyncio.ensure_future(_disconnect(receive))

            def heard(w: asyncio.Future[None]) -> None:
                if not w.cancelled() and w.exception() is None:
                    went()

            watch.add_done_callback(heard)
        try:
            start = {"type": "http.response.start", "status": self.status_code}
            await send({**start, "headers": self.raw_headers})
            await self._relay(send)
        except asyncio.CancelledError:
            if not left:
                raise
            task.uncancel()  # the client went away: the relay ends here, quietly
        finally:
            if hook is not None:
                hook.discard(went)
            else:
                watch.cancel()
            self._pick.finish()
            if self.watch is not None:
                self.watch.stream_ended(cut=not self._pick.ok)
            await self._answer.aclose()


def _body(data: bytes, more: bool) -> Message:
    return {"type": "http.response.body", "body": data, "more_body": more}


async def _disconnect(receive: Receive) -> None:
    """Returns once the client is gone (what else it sends of a finished request is nothing)."""
    while (await receive())["type"] != "http.disconnect":
        pass
