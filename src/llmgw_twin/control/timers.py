"""The lifecycle's timers, as data, and what each does when it comes due.

`Timers` keeps a heap of (when, kind, replica): each placed replica's start deadline (`start`),
each degraded replica's grace (`degraded`), each backed-off replacement's earliest placement
(`backoff`). The controller's tick runs what is due (`run`): a missed start deadline fails the
replica as the engine's failure and keeps its profile off the nodes it tried; a grace that ran
out fails a degraded replica, blamed on the worker ranks not answering, else on its leader; an
ended back-off tells the lifecycle a pending replica may fit. The controller's own lag moves
every deadline and grace later (`excuse`), and a node found lost or rebooted takes back the
failures it caused (`forgive`). Part of `lifecycle.Lifecycle`, which composes it with its `fail`
and `placement_may_fit`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Protocol

from llmgw_twin.control.durable import PutQuarantine, QuarantineRow
from llmgw_twin.control.model import NodeId, ReplicaId, ReplicaState, ShardState
from llmgw_twin.control.parts import Books
from llmgw_twin.control.replicas import ReplicaRecord


class Fail(Protocol):
    """`Lifecycle.fail`."""

    def __call__(
        self,
        rec: ReplicaRecord,
        reason: str,
        node: NodeId | None,
        crash: bool = False,
        blamed: tuple[NodeId, ...] | None = None,
        reporter: NodeId | None = None,
    ) -> None: ...


class Timers:
    def __init__(self, books: Books, fail: Fail, may_fit: Callable[[], None]) -> None:
        self.timings = books.timings
        self.replicas = books.replicas
        self.out = books.out
        self.failures = books.failures
        self._fail = fail
        self._may_fit = may_fit
        self._heap: list[tuple[int, str, ReplicaId]] = []

    def arm(self, at_ms: int, kind: str, rid: ReplicaId) -> None:
        heapq.heappush(self._heap, (at_ms, kind, rid))

    def next_due_ms(self) -> int | None:
        """When the earliest timer is due (`run` acts on nothing before)."""
        return self._heap[0][0] if self._heap else None

    def watch_start(self, rec: ReplicaRecord) -> None:
        """Arm the replica's start deadline (from now: placement, or adoption while loading)."""
        self.replicas.unready[rec.id] = None
        deadline = self.out.now_ms + self.timings.start_deadline_ms(rec.profile)
        self.arm(deadline, "start", rec.id)

    def run(self) -> None:
        """Act on every timer that is due: missed start deadlines, degraded replicas past their
        grace, back-offs that ended."""
        now = self.out.now_ms
        while self._heap and self._heap[0][0] <= now:
            _, kind, rid = heapq.heappop(self._heap)
            rec = self.replicas.get(rid)
            if rec is None or not rec.state.live:
                continue
            if kind == "start" and rid in self.replicas.unready:
                limit = self.timings.start_deadline_ms(rec.profile)
                reason = f"not ready within {limit // 1000}s"
                self._fail(rec, reason, None, crash=True, blamed=rec.nodes)
                self.quarantine_nodes(rec, reason)
            elif kind == "degraded" and rec.state is ReplicaState.DEGRADED:
                if now - rec.degraded_since_ms >= self.timings.unresponsive_grace_ms:
                    self._fail_unresponsive(rec)
            elif kind == "backoff" and rec.state is ReplicaState.PENDING:
                self._may_fit()

    def excuse(self, lag_ms: int) -> None:
        """The controller itself fell `lag_ms` behind: that long of every start deadline and
        degraded grace running was the controller's, not the engine's (its reports waited in
        line), so each ends that much later. O(timers), once per episode of lag."""
        degraded: set[ReplicaId] = set()
        timers = []
        for at, kind, rid in self._heap:
            moved = kind in ("start", "degraded")
            if kind == "degraded":
                degraded.add(rid)
            timers.append((at + lag_ms if moved else at, kind, rid))
        heapq.heapify(timers)
        self._heap = timers
        for rid in degraded:
            rec = self.replicas.get(rid)
            if rec is not None and rec.state is ReplicaState.DEGRADED:
                rec.degraded_since_ms += lag_ms

    def _fail_unresponsive(self, rec: ReplicaRecord) -> None:
        """A degraded replica past its grace: blamed on the workers not answering (a hung
        worker stalls its leader too: the leader is the symptom), else on its leader."""
        hung = [
            s
            for s in rec.specs[1:]
            if (r := rec.reports.get(s.rank)) is not None and r.state is ShardState.UNRESPONSIVE
        ]
        if hung:
            where = ", ".join(f"{s.rank} on {s.node}" for s in hung)
            reason = f"worker rank {where} not answering for {self._grace_s()}s"
            blamed = tuple(s.node for s in hung)
            self._fail(rec, reason, blamed[0], crash=True, blamed=blamed)
            return
        leader = rec.nodes[0]
        reason = f"leader on {leader} not answering for {self._grace_s()}s"
        self._fail(rec, reason, leader, crash=True)

    def forgive(self, node: NodeId, since_ms: int, why: str) -> None:
        """`node` was lost or rebooted after it was last heard at `since_ms`: the engine
        failures counted since of replicas with a shard on it were its doing, not the
        engines'. They leave the failure history (`replica.forgiven`), and a replacement
        backed off on their account may start sooner."""
        forgiven = self.failures.forgive(node, since_ms, self.out.now_ms)
        models = sorted({f.model for f in forgiven})
        for f in forgiven:
            self.out.emit(
                "replica.forgiven",
                model=f.model,
                replica=f.replica,
                node=node,
                reason=f"{why}: not the engine's failure",
            )
            for write in self.failures.history(f.model, f.profile, f.blamed):
                self.out.write(write)
        now = self.out.now_ms
        for model in models:
            delay = self.failures.backoff_ms(model, now)
            for rec in self.replicas.live(model):
                if rec.state is ReplicaState.PENDING and rec.not_before_ms > now + delay:
                    rec.not_before_ms = now + delay
                    self.arm(rec.not_before_ms, "backoff", rec.id)
                    self._may_fit()

    def _grace_s(self) -> int:
        return self.timings.unresponsive_grace_ms // 1000

    def quarantine_nodes(self, rec: ReplicaRecord, reason: str) -> None:
        """A replica that could not become ready keeps its profile off the nodes it tried."""
        rows = self.failures.quarantine(
            rec.nodes, rec.profile.name, self.out.now_ms, f"{rec.id} {reason}"
        )
        self.announce(rows)

    def announce(self, quarantines: list[QuarantineRow]) -> None:
        """Quarantines just begun: kept in the store, and said in the trace."""
        for q in quarantines:
            self.out.write(PutQuarantine(q))
            self.out.emit(
                "node.quarantined",
                node=q.node,
                profile=q.profile,
                reason=q.reason,
                until_ms=q.until_ms,
            )
