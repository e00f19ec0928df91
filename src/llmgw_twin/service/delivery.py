"""The controller's commands on their way to the agents.

Role: `Delivery.send(cmd)` is called while a step is carried out and never awaits; each command
becomes a task that posts it to its node's agent (`POST /v1/assign`, `POST /v1/report-request`)
at the address the controller knows for the node, with the node's controller token when the
controller asks for credentials.

Invariants:
- Commands to one node leave in the order they were decided, one at a time; an assignment a
  newer one has superseded is not sent.
- A command to a node with no known address, or whose credential was revoked since, is not
  sent. A failed send is logged and dropped: the core is level-triggered and assigns again once
  the agent's report disagrees.
- `close` waits, bounded, for what is in flight, then cancels the rest.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx

from llmgw_twin.core.model import NodeId
from llmgw_twin.core.protocol import AssignShards, ControllerCommand
from llmgw_twin.service.auth import ControllerKeys
from llmgw_twin.service.tls import ClientTls, client_verify
from llmgw_twin.service.wire import AssignShardsW, RequestReportW

log = logging.getLogger("llmgw_twin.controller")

SEND_TIMEOUT_S = 5.0
"""Bound on one command's delivery to an agent."""


class Delivery:
    def __init__(
        self,
        agent_urls: dict[NodeId, str],
        keys: ControllerKeys | None,
        *,
        tls: ClientTls | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """`agent_urls` is the runtime's own map, read at each send (it changes as nodes are
        onboarded and register)."""
        self._urls = agent_urls
        self._keys = keys
        self._tls = tls
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._node_locks: dict[NodeId, asyncio.Lock] = {}
        self._sent_seq: dict[NodeId, int] = {}
        self._latest_assign: dict[NodeId, int] = {}
        self.in_flight: set[asyncio.Task[None]] = set()

    def open(self) -> None:
        self._client = httpx.AsyncClient(
            transport=self._transport,
            timeout=SEND_TIMEOUT_S,
            trust_env=False,
            verify=client_verify(self._tls),
        )

    async def close(self) -> None:
        if self.in_flight:
            _, late = await asyncio.wait(set(self.in_flight), timeout=SEND_TIMEOUT_S)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()

    def send(self, cmd: ControllerCommand) -> None:
        """Start delivering `cmd`; never awaits."""
        node = cmd.node
        url = self._urls.get(node)
        if url is None:
            log.warning("no address known for node %s: %s not sent", node, type(cmd).__name__)
            return
        seq = self._sent_seq[node] = self._sent_seq.get(node, 0) + 1
        if isinstance(cmd, AssignShards):
            self._latest_assign[node] = seq
        task = asyncio.get_running_loop().create_task(self._deliver(cmd, seq, url))
        self.in_flight.add(task)
        task.add_done_callback(self.in_flight.discard)

    async def _deliver(self, cmd: ControllerCommand, seq: int, url: str) -> None:
        node = cmd.node
        async with self._node_locks.setdefault(node, asyncio.Lock()):
            body: dict[str, Any]
            if isinstance(cmd, AssignShards):
                if self._latest_assign.get(node, 0) > seq:
                    return  # a newer full assignment supersedes this one
                path, body = "/v1/assign", AssignShardsW.from_core(cmd).model_dump(mode="json")
            else:
                path = "/v1/report-request"
                body = RequestReportW.from_core(cmd).model_dump(mode="json")
            assert self._client is not None
            headers = {}
            if self._keys is not None:
                cred = self._keys.node(node)
                if cred is None:
                    return  # revoked since: nothing more goes to it
                headers["authorization"] = "Bearer " + self._keys.controller_token(cred)
            try:
                reply = await self._client.post(url + path, json=body, headers=headers)
                reply.raise_for_status()
            except (httpx.HTTPError, httpx.InvalidURL) as e:
                log.warning("sending %s to %s at %s failed: %s", path, node, url, e)
