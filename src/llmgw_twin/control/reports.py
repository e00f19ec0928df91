"""Reading the agents' shard reports: each node's full report, each shard's state, and what they
mean for its replica (`Controller.handle` passes every registration's and heartbeat's report here).

A report equal to the last one, against an unchanged assignment, changes nothing. A shard that is
not the one its replica placed on that node is ignored (a node speaks for itself only) and the node
is re-told its assignment; a shard that ran and is gone, or exited, or is no longer up, takes its
replica out of service in this very step.

A failure is the engine's own (counted toward back-off and quarantine) unless the report shows
the infrastructure caused it: a shard of a multi-node replica that exited or went down while a
node of that replica has its fabric links down, or a shard gone from a node that just booted
again. Then the reason says so, `(fabric down: not the engine's failure)`, and nothing counts.
A worker that stops answering its probe degrades its replica as a hung leader does; the failure
after the grace is blamed on that worker's rank and node (`Timers.run`).
"""

from __future__ import annotations

from llmgw_twin.control.assignments import Assignments
from llmgw_twin.control.lifecycle import Lifecycle
from llmgw_twin.control.model import NodeId, ReplicaState, ShardKey, ShardReport, ShardState
from llmgw_twin.control.outbox import Outbox
from llmgw_twin.control.replicas import ReplicaRecord, ReplicaTable


class ShardReports:
    def __init__(
        self, replicas: ReplicaTable, assignments: Assignments, life: Lifecycle, out: Outbox
    ) -> None:
        self._replicas = replicas
        self._assignments = assignments
        self._life = life
        self._out = out

    def observe(
        self, node: NodeId, shards: tuple[ShardReport, ...], rebooted: bool = False
    ) -> None:
        """Record a node's full report: every shard it runs, and by omission what it does not.
        `rebooted`: the node registered again, booted empty (its shards are gone with it).

        A report equal to the last one, against an unchanged assignment, changes nothing: the
        usual heartbeat costs one comparison."""
        assignments = self._assignments
        if assignments.unchanged(node, shards):
            return
        assignments.record_report(node, shards)
        reported: set[ShardKey] = set()
        for report in shards:
            key = report.spec.key
            reported.add(key)
            rec = self._replicas.get(key.replica)
            if rec is None or not rec.state.live or not rec.placed:
                assignments.dirty.add(node)  # an orphan: the next assignment drops it
                continue
            if (
                report.spec.node != node
                or key.rank >= len(rec.specs)
                or not rec.specs[key.rank].same_shard(report.spec)
            ):
                # not the shard this replica placed here: a node speaks for itself only
                assignments.dirty.add(node)
                continue
            self._record(rec, key.rank, report)
        wanted = assignments.keys(node)
        if set(wanted) != reported:
            assignments.out_of_sync(node)
        for key in sorted(wanted):
            rec = self._replicas[key.replica]
            if rec.state.live and key not in reported and key.rank in rec.reports:
                # it ran here and is gone without an exit report: the agent lost it
                reason = f"shard {key.rank} vanished from {node}"
                cause = "node rebooted" if rebooted else self._infra(rec)
                self._fail(rec, reason, node, cause)

    def _record(self, rec: ReplicaRecord, rank: int, report: ShardReport) -> None:
        before = rec.reports.get(rank)
        rec.reports[rank] = report
        if before is not None and before.state is report.state:
            return
        spec = rec.specs[rank]
        if report.state is ShardState.EXITED:
            # whole no more: out of service in this very step, not at the next tick
            reason = f"shard {rank} exited with code {report.exit_code} on {spec.node}"
            if report.reason is not None:  # the agent's own words: it refused, or stopped it
                reason = (
                    f"shard {rank} on {spec.node}: {report.reason} (exit code {report.exit_code})"
                )
            self._fail(rec, reason, spec.node, self._infra(rec))
            return
        if rec.state is ReplicaState.ADOPTING:
            return  # a shard that was running before the restart: nothing started it now
        if report.state is ShardState.UNRESPONSIVE:
            if rec.state is ReplicaState.READY:
                who = "leader" if rank == 0 else f"worker rank {rank}"
                reason = f"{who} on {spec.node} not answering its health probe"
                self._life.degrade(rec, reason)
            return  # degraded already, or not ready yet: its grace or start deadline judges it
        up = ShardState.SERVING if rank == 0 else ShardState.RUNNING
        if rec.state is ReplicaState.DEGRADED and report.state is up:
            if rec.whole():  # every rank answers again
                self._life.recover(rec, rec.reports[0].endpoint)
            return
        if rec.state in (ReplicaState.READY, ReplicaState.DEGRADED) and report.state is not up:
            reason = f"shard {rank} on {spec.node} went {report.state.value}"
            self._fail(rec, reason, spec.node, self._infra(rec))
            return
        if report.state is ShardState.STARTING:
            self._out.emit(
                "shard.started",
                node=spec.node,
                model=rec.model,
                replica=rec.id,
                rank=rank,
                argv=report.argv,
            )
        elif report.state is ShardState.SERVING:
            self._out.emit(
                "shard.serving", node=spec.node, model=rec.model, replica=rec.id, rank=rank
            )
        self._replicas.dirty.add(rec.id)

    def _infra(self, rec: ReplicaRecord) -> str | None:
        """The infrastructure's part in a shard of `rec` going down, if the reports show one:
        a multi-node replica whose fabric link is down on one of its nodes."""
        link_up = self._life.capacity.link_up
        if rec.shard_count > 1 and not all(link_up(n) for n in rec.nodes):
            return "fabric down"
        return None

    def _fail(self, rec: ReplicaRecord, reason: str, node: NodeId, cause: str | None) -> None:
        """A shard on `node` exited, vanished or went down: the engine's failure unless `cause`
        names the infrastructure's."""
        if cause is None:
            self._life.fail(rec, reason, node, crash=True, reporter=node)
        else:
            self._life.fail(rec, f"{reason} ({cause}: not the engine's failure)", node)
