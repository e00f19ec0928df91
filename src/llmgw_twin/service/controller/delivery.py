"""The controller's commands on their way to the agents: bounded, coalesced, retried.

Role: `Delivery.send(cmd)` is called while a step is carried out and never awaits. It puts the
command in its node's pending list; a fixed set of workers (`max_in_flight`, each with its own
pooled connection) posts each node's pending commands to its agent (`POST /v1/assign`,
`POST /v1/report-request`) at the address the controller knows for the node, with the node's
controller token when the controller asks for credentials.

Invariants:
- At most `max_in_flight` sends are in flight, whatever the fleet's size: a registration storm of
  the whole fleet queues, it does not open a connection per node.
- One pending command of each kind per node: a newer assignment replaces one not yet sent (each
  is the node's whole set), a report request is asked once. A node's commands leave in the order
  their newest versions were decided, one at a time.
- A failed send is retried with a capped exponential back-off (`RETRY_FIRST_S` doubling to
  `RETRY_MAX_S`) up to `RETRY_ATTEMPTS` times, and only while it is still the newest of its kind
  for its node: one decided since, whether still pending or already delivered, supersedes it
  (a stale assignment retried after a newer one went would stop the newer one's shards). After
  its last attempt it is dropped with a warning (the core is level-triggered and assigns again
  once the agent's report disagrees).
- A command to a node with no known address, or whose credential was revoked, is not sent.
- Nothing is sent while the leader is past its lease deadline (`acting`): what is pending waits
  until the store renews the lease, or the process ends.
- `on_report_tried(node)` is called once a report request to `node` has been tried: its body
  written to the connection (delivered: the answer is the agent's to give), or its send failed,
  or it could not be sent. A restarted controller counts the agent's time to answer from then,
  not from when it queued the request, and not from the answer: an agent that is powered off
  takes the request into its kernel's buffers and never answers, and the wait for it must end
  an interval after the request left, as for any silent agent.
- `close` lets what is in flight finish (bounded), then stops the workers.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import httpx

from llmgw_twin.control.model import NodeId
from llmgw_twin.control.protocol import AssignShards, ControllerCommand, RequestReport
from llmgw_twin.service.common.auth import ControllerKeys
from llmgw_twin.service.common.tls import ClientTls, client_verify
from llmgw_twin.service.common.wire import AssignShardsW, RequestReportW

log = logging.getLogger("llmgw_twin.controller")

SEND_TIMEOUT = httpx.Timeout(connect=5.0, read=10.0, write=10.0, pool=None)
"""One send's bounds; no bound on waiting for a connection: there is one per worker."""
MAX_IN_FLIGHT = 64
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 30.0
RETRY_ATTEMPTS = 8
"""0.5 + 1 + 2 + 4 + 8 + 16 + 30 s: a node unreachable for about a minute is given up on."""
CLOSE_GRACE_S = 5.0


class Delivery:
    def __init__(
        self,
        agent_urls: dict[NodeId, str],
        keys: ControllerKeys | None,
        *,
        tls: ClientTls | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        max_in_flight: int = MAX_IN_FLIGHT,
        epoch: Callable[[], int] = lambda: 0,
        acting: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """`agent_urls` is the runtime's own map, read at each send (it changes as nodes are
        onboarded and register); `epoch`, the leader's epoch every command carries; `acting`,
        awaited before each send: it returns once the leader may act (`Leadership.acting`)."""
        self._urls = agent_urls
        self._epoch = epoch
        self._acting = acting
        self._keys = keys
        self._tls = tls
        self._transport = transport
        self.max_in_flight = max_in_flight
        self._clients: list[httpx.AsyncClient] = []
        """One per worker, each with one connection: a shared pool's bookkeeping grows with
        the requests waiting on it times its connections, and took most of the CPU in a
        registration storm."""
        self._pending: dict[NodeId, list[tuple[ControllerCommand, int]]] = {}
        """node -> its commands not yet sent, each with the attempts made, in order"""
        self._newest: dict[tuple[NodeId, type], ControllerCommand] = {}
        """(node, kind) -> the newest command of that kind decided for the node: only it may be
        retried (an older one, its send failed, must never follow a newer one that went)."""
        self._queue: collections.deque[NodeId] = collections.deque()
        self._queued: set[NodeId] = set()
        self._busy: set[NodeId] = set()
        self._wake = asyncio.Event()
        self._workers: list[asyncio.Task[None]] = []
        self._retries: set[asyncio.Task[None]] = set()
        self.on_report_tried: Callable[[NodeId], None] = lambda node: None
        self.sent = 0
        self.failed = 0
        """Sends that failed (each retry counted), and commands given up on."""
        self.dropped = 0

    @property
    def in_flight(self) -> int:
        """Nodes with a send in progress or queued."""
        return len(self._busy) + len(self._queued)

    def open(self) -> None:
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1, keepalive_expiry=60.0)
        verify = client_verify(self._tls)
        if verify is True:  # one TLS context for every worker: each makes its own otherwise
            verify = httpx.create_ssl_context()
        self._clients = [
            httpx.AsyncClient(
                transport=self._transport,
                timeout=SEND_TIMEOUT,
                limits=limits,
                trust_env=False,
                verify=verify,
            )
            for _ in range(self.max_in_flight)
        ]
        loop = asyncio.get_running_loop()
        self._workers = [loop.create_task(self._work(c)) for c in self._clients]

    async def close(self) -> None:
        for task in self._retries:
            task.cancel()
        deadline = asyncio.get_running_loop().time() + CLOSE_GRACE_S
        while self._busy and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, *self._retries, return_exceptions=True)
        self._workers = []
        for client in self._clients:
            await client.aclose()
        self._clients = []

    def send(self, cmd: ControllerCommand) -> None:
        """Queue `cmd` for its node, replacing a pending one of its kind; never awaits."""
        node = cmd.node
        if node not in self._urls:
            log.warning("no address known for node %s: %s not sent", node, type(cmd).__name__)
            if isinstance(cmd, RequestReport):
                self.on_report_tried(node)
            return
        self._newest[node, type(cmd)] = cmd
        self._put(cmd, 0)

    def _put(self, cmd: ControllerCommand, attempts: int) -> None:
        node = cmd.node
        pending = self._pending.setdefault(node, [])
        pending[:] = [(c, a) for c, a in pending if type(c) is not type(cmd)]
        pending.append((cmd, attempts))
        if node not in self._queued and node not in self._busy:
            self._queued.add(node)
            self._queue.append(node)
            self._wake.set()

    async def _work(self, client: httpx.AsyncClient) -> None:
        while True:
            while not self._queue:
                self._wake.clear()
                await self._wake.wait()
            node = self._queue.popleft()
            self._queued.discard(node)
            self._busy.add(node)
            try:
                while self._pending.get(node):
                    if self._acting is not None:
                        await self._acting()  # past the lease deadline: held until renewed
                        if not self._pending.get(node):
                            break
                    cmd, attempts = self._pending[node].pop(0)
                    ok = await self._deliver(cmd, client)
                    if isinstance(cmd, RequestReport):
                        self.on_report_tried(node)
                    if not ok:
                        self._retry(cmd, attempts + 1)
            finally:
                self._busy.discard(node)
                if not self._pending.get(node):
                    self._pending.pop(node, None)
                elif node not in self._queued:  # queued again while this worker sent
                    self._queued.add(node)
                    self._queue.append(node)
                    self._wake.set()

    def _retry(self, cmd: ControllerCommand, attempts: int) -> None:
        if attempts >= RETRY_ATTEMPTS:
            self.dropped += 1
            log.warning(
                "giving up on %s to %s after %d attempts", type(cmd).__name__, cmd.node, attempts
            )
            return
        delay = min(RETRY_FIRST_S * 2 ** (attempts - 1), RETRY_MAX_S)

        async def later() -> None:
            await asyncio.sleep(delay)
            if self._newest.get((cmd.node, type(cmd))) is not cmd:
                return  # a newer one of its kind was decided since: it is on its way, or went
            if cmd.node in self._urls:
                self._put(cmd, attempts)

        task = asyncio.get_running_loop().create_task(later())
        self._retries.add(task)
        task.add_done_callback(self._retries.discard)

    async def _deliver(self, cmd: ControllerCommand, client: httpx.AsyncClient) -> bool:
        """Post `cmd`; True when it was delivered or must not be (no address, revoked)."""
        node = cmd.node
        url = self._urls.get(node)
        if url is None:
            return True
        body: dict[str, Any]
        cmd = replace(cmd, epoch=self._epoch())
        if isinstance(cmd, AssignShards):
            path, body = "/v1/assign", AssignShardsW.from_core(cmd).model_dump(mode="json")
        else:
            path = "/v1/report-request"
            body = RequestReportW.from_core(cmd).model_dump(mode="json")
        headers = {}
        if self._keys is not None:
            cred = self._keys.node(node)
            if cred is None:
                return True  # revoked since: nothing more goes to it
            headers["authorization"] = "Bearer " + self._keys.controller_token(cred)
        extensions: dict[str, Any] = {}
        if isinstance(cmd, RequestReport):

            async def trace(event: str, _info: dict[str, Any]) -> None:
                if event.endswith(".send_request_body.complete"):
                    self.on_report_tried(node)  # on its way: the answer is the agent's

            extensions["trace"] = trace
        try:
            reply = await client.post(url + path, json=body, headers=headers, extensions=extensions)
            reply.raise_for_status()
        except (httpx.HTTPError, httpx.InvalidURL) as e:
            self.failed += 1
            log.warning("sending %s to %s at %s failed: %s", path, node, url, e)
            return False
        self.sent += 1
        return True
