"""The agent's reports to the controller: registrations and heartbeats, one at a time, in order.

Role: `AgentRuntime` hands each report the agent core makes to `Reports.enqueue`; `send_all`
posts them one after another to the controller that answered last (the others in turn: one
leads). A report that fails is not sent again: the core is level-triggered, and the next
heartbeat carries the whole state again.

Invariants:
- In the order the core made them, so the controller never sees a state go backwards; a newer
  heartbeat replaces one not yet sent (each is the whole set), except that a late heartbeat
  (`late.py`, held back on purpose) is appended and never replaces a newer one.
- A 401 makes the agent read its credential file again (it may have been rotated).
- The controller's answer may ask for a registration (`report: true`): `asked` is called.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable

import httpx

from llmgw_twin.control.protocol import Heartbeat, NodeRegistered
from llmgw_twin.service.common.auth import AgentKeys
from llmgw_twin.service.common.leaders import Controllers
from llmgw_twin.service.common.wire import HeartbeatW, NodeRegisteredW, ReportReplyW

log = logging.getLogger("llmgw_twin.agent")

Report = Heartbeat | NodeRegistered


def _detail(reply: httpx.Response) -> str:
    """The controller's reason for an error reply, as it gave it."""
    try:
        detail = reply.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    return str(detail) if detail is not None else reply.reason_phrase


class Reports:
    def __init__(
        self,
        controllers: Controllers,
        client: Callable[[], httpx.AsyncClient | None],
        keys: Callable[[], AgentKeys | None],
        reload_credential: Callable[[], None],
        asked: Callable[[], None],
        advertise_url: str,
    ) -> None:
        self.controllers = controllers
        self._client = client
        self._keys = keys
        self._reload_credential = reload_credential
        self._asked = asked
        self._advertise_url = advertise_url
        self.queue: collections.deque[Report] = collections.deque()
        self._ready = asyncio.Event()
        self.failing = False
        """The last report failed (the next failures are logged quietly)."""

    def enqueue(self, report: Report, late: bool = False) -> None:
        queue = self.queue
        newer = not late and isinstance(report, Heartbeat)
        if newer and queue and isinstance(queue[-1], Heartbeat):
            queue[-1] = report  # each report is the whole set: the newer one says it all
        else:
            queue.append(report)
        self._ready.set()

    async def send_all(self) -> None:
        """Post what is queued, one at a time, for ever (cancelled when the agent stops)."""
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self.queue:
                await self._post(self.queue.popleft())

    async def _post(self, report: Report) -> None:
        client = self._client()
        assert client is not None, "the agent is not started"
        if isinstance(report, Heartbeat):
            path = "/v1/agents/heartbeat"
            body = HeartbeatW.from_core(report).model_dump(mode="json")
        else:
            path = "/v1/agents/register"
            body = NodeRegisteredW.from_core(report, self._advertise_url).model_dump(mode="json")

        async def send(base: str) -> ReportReplyW:
            headers = {}
            keys = self._keys()
            if keys is not None:
                headers["authorization"] = "Bearer " + keys.token
            reply = await client.post(base + path, json=body, headers=headers)
            if reply.status_code == 401 and keys is not None:
                self._reload_credential()
            if reply.is_error:
                raise httpx.HTTPStatusError(
                    f"{reply.status_code}: {_detail(reply)}", request=reply.request, response=reply
                )
            return ReportReplyW.model_validate(reply.json())

        try:
            # the controller that answered last first; the others in turn (one leads)
            answer = await self.controllers.first_answer(send, (httpx.HTTPError, ValueError))
        except (httpx.HTTPError, ValueError) as e:
            # level-triggered: the next heartbeat carries the whole state again
            level = logging.DEBUG if self.failing else logging.WARNING
            log.log(level, "report to %s failed: %s", " or ".join(self.controllers.urls), e)
            self.failing = True
            return
        if self.failing:
            log.info("the controller at %s answers again", self.controllers.current)
            self.failing = False
        if answer.report:
            self._asked()
