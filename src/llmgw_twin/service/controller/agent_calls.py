"""The controller runtime's agent calls (`ControllerRuntime` inherits them): a node agent's
registration and heartbeat, and the nodes' addresses and credentials they are checked against.

Role: behind `POST /v1/agents/register` and `POST /v1/agents/heartbeat` (`routes.py`; a
heartbeat taking the short way, `fastpath.py`, calls `heard`). Each message goes into the core
through the runtime's `_handle`: decided under its lock, answered once durable. A runtime that
comes to lead reloads the nodes' addresses and credentials from the store (`_reload_nodes`).

Invariants:
- A node's credential speaks for that node only, and reports its own shards only (403).
- With credentials, the controller calls a node only at the address its credential is bound
  to: a registration naming another is logged (again only when it changes), never adopted;
  without them, the address a node registers is stored before its registration is handled.
- A heartbeat from a node the core does not know is answered in-band (`report: true`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from llmgw_twin.control.model import NodeId
from llmgw_twin.control.protocol import ControllerEvent, Heartbeat, RequestReport, Step
from llmgw_twin.service.common.auth import Caller, ControllerKeys, NodeCredential
from llmgw_twin.service.common.wire import HeartbeatW, NodeRegisteredW, Refused, ReportReplyW
from llmgw_twin.service.controller.committer import Committer
from llmgw_twin.store.base import SqlStore

if TYPE_CHECKING:
    from llmgw_twin.service.controller.metrics import ControllerMetrics

log = logging.getLogger("llmgw_twin.controller")


class AgentCalls:
    """What the runtime gives these calls is declared here (set in its `__init__`)."""

    keys: ControllerKeys | None
    store: SqlStore
    committer: Committer
    metrics: ControllerMetrics
    _agent_urls: dict[NodeId, str]
    _misbound: dict[NodeId, str]

    async def _handle(self, event: ControllerEvent, answered_in_band: NodeId | None = None) -> Step:
        raise NotImplementedError

    def _reload_nodes(self) -> None:
        """The nodes' addresses and credentials as the store holds them now: a standby read
        them when it started, and the leaders before it may have onboarded nodes since."""
        if self.keys is not None:
            stored = {row[0]: NodeCredential(*row) for row in self.store.credentials()}
            for held in list(self.keys.nodes()):
                if held.node not in stored:  # revoked meanwhile
                    self.keys.revoke(held.node)
                    self._agent_urls.pop(NodeId(held.node), None)
            for cred in stored.values():
                self.keys.put(cred)
                self._agent_urls[NodeId(cred.node)] = cred.agent_url
        else:
            self._agent_urls.update(self.store.agent_urls())

    def _speaks_for(self, caller: Caller | None, node: str, shard_nodes: list[str]) -> None:
        """A node's credential acts as that node only, and reports its own shards only."""
        if caller is None:
            return  # no credentials asked
        problem = None
        if caller.node != node:
            problem = f"this credential is node {caller.node}'s: it cannot speak for {node}"
        elif others := sorted(set(shard_nodes) - {node}):
            problem = f"node {node} reported shards placed on {', '.join(others)}"
        if problem is not None:
            log.warning("refused a report: %s", problem)
            raise Refused(problem, 403)

    async def register(self, body: NodeRegisteredW, caller: Caller | None) -> ReportReplyW:
        msg = body.to_core()
        node = msg.info.node
        self._speaks_for(caller, node, [s.spec.node for s in body.shards])
        if self.keys is not None:
            bound = self._agent_urls.get(node)
            if body.agent_url.rstrip("/") != bound and self._misbound.get(node) != body.agent_url:
                self._misbound[node] = body.agent_url
                log.warning(
                    "node %s registers agent_url %s, but its credential is bound to %s: the "
                    "controller calls %s only (onboard the node again to change it)",
                    node,
                    body.agent_url,
                    bound,
                    bound,
                )
        elif self._agent_urls.get(node) != body.agent_url:
            await self.committer.run(self.store.put_agent_url, node, body.agent_url)
            self._agent_urls[node] = body.agent_url
        await self._handle(msg)
        return ReportReplyW()

    async def heartbeat(self, body: HeartbeatW, caller: Caller | None) -> ReportReplyW:
        return ReportReplyW(report=await self.heard(body.to_core(), caller))

    async def heard(self, msg: Heartbeat, caller: Caller | None) -> bool:
        """A heartbeat, its body already read; True when it asks, in-band, for a report."""
        self._speaks_for(caller, msg.node, [s.spec.node for s in msg.shards])
        step = await self._handle(msg, answered_in_band=msg.node)
        self.metrics.heartbeats += 1
        return any(isinstance(c, RequestReport) and c.node == msg.node for c in step.commands)
