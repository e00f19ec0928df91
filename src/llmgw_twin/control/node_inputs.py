"""A node agent's registrations and heartbeats as the controller core takes them.

`NodeInputs` is one part of the controller (`Controller.handle` hands it every `NodeRegistered`
and `Heartbeat`). It sorts out which report counts: a report older than the newest taken from
the same agent process (its version) says only that the node is alive; a heartbeat from an agent
process since replaced is dropped; a heartbeat from a node this controller does not know asks it
to register. A report that counts goes to the node registry (health, fabric links, failed GPUs)
and its shard list to `reports.ShardReports`. A node registering again under a new agent with
nothing running booted again: the failures it caused are forgiven (`Timers.forgive`).

The usual heartbeat, one that changes nothing but its node's last-seen time, costs one identity
test in the shell: it returns `QUIET_STEP`, the same empty step every time.

Invariant: a late report never undoes a newer one.
"""

from __future__ import annotations

from llmgw_twin.control.lifecycle import Lifecycle
from llmgw_twin.control.model import NodeInfo
from llmgw_twin.control.nodes import NodeRegistry
from llmgw_twin.control.parts import Books
from llmgw_twin.control.protocol import Heartbeat, NodeRegistered, RequestReport, Step
from llmgw_twin.control.reports import ShardReports

QUIET_STEP = Step()
"""What a heartbeat that changes nothing but its node's last-seen time returns: the same empty
step every time, so a shell can tell it at the cost of one identity test."""


class NodeInputs:
    """Registrations and heartbeats (see the module's text)."""

    def __init__(
        self, books: Books, fleet: NodeRegistry, reports: ShardReports, life: Lifecycle
    ) -> None:
        self.timings = books.timings
        self._out = books.out
        self._assignments = books.assignments
        self._fleet = fleet
        self._reports = reports
        self._life = life

    def registered(self, event: NodeRegistered, now_ms: int) -> None:
        """A node agent registered (at its start, or asked to): its facts and full report."""
        info, shards, incarnation = event.info, event.shards, event.incarnation
        if info.node in self._fleet.infos and self._fleet.stale(
            info.node, incarnation, event.version
        ):
            self._fleet.hear(info.node, now_ms)  # late: alive, its report outdated
            return
        self._fleet.took(info.node, incarnation, event.version)
        before = self._fleet.incarnations.get(info.node)
        last_seen = self._fleet.health.last_seen_ms(info.node)
        self._fleet.register(info, now_ms, incarnation)
        self._heartbeat_fits(info, event.heartbeat_interval_ms)
        self._fleet.link(info.node, event.fabric_up)
        self._fleet.gpus_failed(info.node, event.failed_gpus)
        # a new agent with nothing running: the node booted again, empty
        rebooted = before is not None and before != incarnation and not shards
        self._reports.observe(info.node, shards, rebooted)
        if rebooted and last_seen is not None:
            self._life.timers.forgive(info.node, last_seen, f"node {info.node} rebooted")

    def heartbeat(self, event: Heartbeat, now_ms: int) -> Step | None:
        """A node's heartbeat. Returns the step to answer with where it is not the outbox's
        (a report request, `QUIET_STEP`); None: what it decided is in the outbox."""
        node, shards = event.node, event.shards
        if node not in self._fleet.infos:
            # unknown here (registered while this controller was down, say)
            return Step(commands=(RequestReport(node),))
        if 0 < event.incarnation < self._fleet.incarnations.get(node, 0):
            return QUIET_STEP  # sent by an agent process since replaced: stale
        if self._fleet.stale(node, event.incarnation, event.version):
            # delayed past a newer report of the same process: it says the node is
            # alive, never what it runs (a late report never undoes a newer one)
            self._fleet.hear(node, now_ms)
            return None
        self._fleet.took(node, event.incarnation, event.version)
        if self._fleet.hear_quiet(
            node, now_ms, event.fabric_up, event.failed_gpus
        ) and self._assignments.unchanged(node, shards):
            return QUIET_STEP  # the usual heartbeat: nothing else to record or decide
        self._fleet.hear(node, now_ms)
        self._fleet.link(node, event.fabric_up)
        self._fleet.gpus_failed(node, event.failed_gpus)
        self._reports.observe(node, shards)
        return None

    def _heartbeat_fits(self, info: NodeInfo, interval_ms: int) -> None:
        """A node registering with a heartbeat interval not shorter than `node_suspect_after`
        would turn suspect between its heartbeats: said, each time it registers so."""
        suspect = self.timings.node_suspect_after_ms
        if interval_ms < suspect:
            return
        self._out.emit(
            "node.heartbeat_too_slow",
            node=info.node,
            fabric=info.fabric,
            heartbeat_interval_ms=interval_ms,
            reason=f"the agent heartbeats every {interval_ms} ms, not less than this "
            f"controller's node_suspect_after of {suspect} ms: the node will turn suspect "
            "between heartbeats; set the agent's heartbeat_interval below it",
        )
