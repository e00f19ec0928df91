"""What recent failures teach placement: back-off, quarantine, and nodes not heard since.

Only the engine's own failures count here (a crash, a hang, a missed start deadline), each
against the rank and node that failed; a failure the infrastructure caused (node lost or
rebooted, fabric down, GPU failed, a peer lost with its node) is recorded nowhere, and one
counted before its cause was known is forgiven (`forgive`) once it is. `FailureBook` keeps:
- each model's recent failures: the n-th within `failure_window` delays the next replacement by
  `restart_backoff * 2**(n-2)`, capped, so a crash loop slows down exponentially while a single
  failure is replaced at once;
- each (node, profile)'s recent failures: at `quarantine_after` of them within the window, or
  once their decaying score (each failure weighs 1, halved every `failure_half_life`) reaches
  `quarantine_score`, the node is quarantined for that profile until `quarantine_for` has
  passed (or an operator clears it), so the replacement goes elsewhere: the window catches a
  fast loop, the score a slow one (a crash every six minutes);
- the nodes of every failed replica that have not been heard from since it failed: a replacement
  avoids them (a node whose shard just died may itself be dead, not yet declared lost).

Failure times are kept while they still weigh (`HISTORY_HALF_LIVES` half-lives, at most
`HISTORY_KEPT` per key) and written to the store as they are, so a successor computes the same
score and back-off. Invariants: history only drops old entries or forgiven ones (deterministic,
no clock read); a quarantine's `until_ms` never moves earlier except by an operator's clear.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from llmgw_twin.control.durable import PutModelFailures, PutNodeFailures, QuarantineRow
from llmgw_twin.control.model import ModelName, NodeId, ProfileName, ReplicaId, Timings

HISTORY_HALF_LIVES = 8
"""A failure older than this many half-lives weighs under 1/256 and is dropped (unless the
window is longer)."""
HISTORY_KEPT = 64
"""The most failure times kept per model and per (node, profile)."""


@dataclass(frozen=True, slots=True)
class CountedFailure:
    """An engine failure counted toward back-off and quarantine, kept a while in case its cause
    turns out to be the infrastructure's (`FailureBook.forgive`)."""

    replica: ReplicaId
    model: ModelName
    profile: ProfileName
    t_ms: int
    blamed: tuple[NodeId, ...]
    nodes: tuple[NodeId, ...]


def score(times: deque[int] | tuple[int, ...], now_ms: int, half_life_ms: int) -> float:
    """The decaying failure score: each failure weighs 1, halved every half-life."""
    return sum(math.pow(0.5, (now_ms - t) / half_life_ms) for t in times if t <= now_ms)


class FailureBook:
    def __init__(self, timings: Timings) -> None:
        self.timings = timings
        self._by_model: dict[ModelName, deque[int]] = {}
        self._by_node: dict[tuple[NodeId, ProfileName], deque[int]] = {}
        self.quarantines: dict[tuple[NodeId, ProfileName], QuarantineRow] = {}
        self._unheard: dict[NodeId, int] = {}
        """node -> when a replica with a shard on it failed; cleared when it is heard after."""
        self._counted: deque[CountedFailure] = deque()
        """Engine failures of the last `node_lost_after` (and a little), oldest first: one whose
        node is then lost or rebooted is forgiven."""
        self._keep_ms = max(
            timings.failure_window_ms, HISTORY_HALF_LIVES * timings.failure_half_life_ms
        )

    def _trim(self, times: deque[int], now_ms: int) -> None:
        while times and (now_ms - times[0] >= self._keep_ms or len(times) > HISTORY_KEPT):
            times.popleft()

    def _in_window(self, times: deque[int], now_ms: int) -> int:
        window = self.timings.failure_window_ms
        return sum(1 for t in times if now_ms - t < window)

    def node_score(self, node: NodeId, profile: ProfileName, now_ms: int) -> float:
        """The node's decaying failure score for the profile (0 when quarantined since)."""
        times = self._by_node.get((node, profile), ())
        return score(times, now_ms, self.timings.failure_half_life_ms)

    # --- recording -----------------------------------------------------------------------------

    def replica_failed(
        self,
        model: ModelName,
        profile: ProfileName,
        blamed: tuple[NodeId, ...],
        nodes: tuple[NodeId, ...],
        now_ms: int,
        crash: bool,
        reporter: NodeId | None = None,
        replica: ReplicaId | None = None,
    ) -> list[QuarantineRow]:
        """Record one failure; returns the quarantines it starts. `blamed`: the nodes whose
        shards failed; `nodes`: every node of the replica; `reporter`: the node whose report
        showed the failure (it just spoke); `crash`: the engine's own failure, which counts
        toward back-off and quarantine (anything else is not recorded)."""
        if not crash:
            return []
        for node in nodes:
            if node != reporter:
                self._unheard[node] = now_ms
        times = self._by_model.setdefault(model, deque())
        times.append(now_ms)
        self._trim(times, now_ms)
        if replica is not None:
            self._counted.append(
                CountedFailure(replica, model, profile, now_ms, tuple(sorted(set(blamed))), nodes)
            )
            self._trim_counted(now_ms)
        started: list[QuarantineRow] = []
        for node in sorted(set(blamed)):
            key = (node, profile)
            failures = self._by_node.setdefault(key, deque())
            failures.append(now_ms)
            self._trim(failures, now_ms)
            if key in self.quarantines:
                continue
            why = self._quarantine_reason(node, profile, failures, now_ms)
            if why is not None:
                row = QuarantineRow(node, profile, now_ms + self.timings.quarantine_for_ms, why)
                self.quarantines[key] = row
                failures.clear()
                started.append(row)
        return started

    def _quarantine_reason(
        self, node: NodeId, profile: ProfileName, failures: deque[int], now_ms: int
    ) -> str | None:
        t = self.timings
        recent = self._in_window(failures, now_ms)
        if recent >= t.quarantine_after:
            return f"{recent} failures of {profile} on {node} within {t.failure_window_ms // 1000}s"
        value = score(failures, now_ms, t.failure_half_life_ms)
        if value >= t.quarantine_score:
            return (
                f"failure score {value:.2f} of {profile} on {node} reached {t.quarantine_score:g}"
                f" ({len(failures)} failures, half-life {t.failure_half_life_ms // 1000}s)"
            )
        return None

    def _trim_counted(self, now_ms: int) -> None:
        horizon = self.timings.node_lost_after_ms + self.timings.heartbeat_interval_ms
        while self._counted and now_ms - self._counted[0].t_ms > horizon:
            self._counted.popleft()

    def forgive(self, node: NodeId, since_ms: int, now_ms: int) -> list[CountedFailure]:
        """`node` was lost or rebooted after it was last heard at `since_ms`: every engine
        failure counted since then of a replica with a shard on it (a peer's exit when its
        connection to the node closed, the node's shards gone) was the node's doing. Their
        times leave the model's and the blamed nodes' history; returns them, oldest first."""
        self._trim_counted(now_ms)
        out = [f for f in self._counted if node in f.nodes and f.t_ms >= since_ms]
        if not out:
            return []
        gone = {id(f) for f in out}
        self._counted = deque(f for f in self._counted if id(f) not in gone)
        for f in out:
            _remove_one(self._by_model.get(f.model), f.t_ms)
            for n in f.blamed:
                _remove_one(self._by_node.get((n, f.profile)), f.t_ms)
        return out

    def quarantine(
        self, nodes: tuple[NodeId, ...], profile: ProfileName, now_ms: int, reason: str
    ) -> list[QuarantineRow]:
        """Quarantine `nodes` for `profile` at once (a replica could not become ready there)."""
        rows: list[QuarantineRow] = []
        for node in sorted(set(nodes)):
            key = (node, profile)
            if key in self.quarantines:
                continue
            row = QuarantineRow(node, profile, now_ms + self.timings.quarantine_for_ms, reason)
            self.quarantines[key] = row
            rows.append(row)
        return rows

    def heard(self, node: NodeId, now_ms: int) -> bool:
        """The node spoke; returns whether that lifted an avoidance."""
        since = self._unheard.get(node)
        if since is not None and now_ms > since:
            del self._unheard[node]
            return True
        return False

    def history(
        self, model: ModelName, profile: ProfileName, blamed: tuple[NodeId, ...]
    ) -> list[PutModelFailures | PutNodeFailures]:
        """The durable writes of the history a failure just changed: a successor counts its
        back-off, score and quarantines on from there, not from zero."""
        out: list[PutModelFailures | PutNodeFailures] = [
            PutModelFailures(model, tuple(self._by_model.get(model, ())))
        ]
        for node in sorted(set(blamed)):
            times = self._by_node.get((node, profile), ())
            out.append(PutNodeFailures(node, profile, tuple(times)))
        return out

    def restore_history(
        self,
        by_model: tuple[tuple[ModelName, tuple[int, ...]], ...],
        by_node: tuple[tuple[tuple[NodeId, ProfileName], tuple[int, ...]], ...],
    ) -> None:
        for model, times in by_model:
            self._by_model[model] = deque(times)
        for key, times in by_node:
            self._by_node[key] = deque(times)

    def waits_on(self, node: NodeId) -> bool:
        """A replica with a shard on the node failed, and the node has not been heard since:
        its next heartbeat lifts an avoidance."""
        return node in self._unheard

    def forget_node(self, node: NodeId) -> None:
        self._unheard.pop(node, None)
        for key in [k for k in self.quarantines if k[0] == node]:
            del self.quarantines[key]
        for key in [k for k in self._by_node if k[0] == node]:
            del self._by_node[key]

    # --- reading -------------------------------------------------------------------------------

    def backoff_ms(self, model: ModelName, now_ms: int) -> int:
        times = self._by_model.get(model)
        if not times:
            return 0
        self._trim(times, now_ms)
        n = self._in_window(times, now_ms)
        if n < 2:
            return 0
        delay = self.timings.restart_backoff_ms * (1 << min(n - 2, 30))
        return min(delay, self.timings.restart_backoff_max_ms)

    def excluded(self, profile: ProfileName) -> frozenset[NodeId]:
        """Nodes a new replica of `profile` must not use now."""
        if not self._unheard and not self.quarantines:
            return frozenset()
        out = set(self._unheard)
        out.update(n for (n, p) in self.quarantines if p == profile)
        return frozenset(out)

    # --- quarantine upkeep ---------------------------------------------------------------------

    def restore(self, rows: tuple[QuarantineRow, ...]) -> None:
        for row in rows:
            self.quarantines[(row.node, row.profile)] = row

    def expired(self, now_ms: int) -> list[QuarantineRow]:
        if not self.quarantines:
            return []
        done = [q for q in self.quarantines.values() if q.until_ms <= now_ms]
        for q in done:
            del self.quarantines[(q.node, q.profile)]
        return sorted(done, key=lambda q: (q.node, q.profile))

    def clear(self, node: NodeId, profile: ProfileName | None) -> list[QuarantineRow]:
        keys = [k for k in self.quarantines if k[0] == node and profile in (None, k[1])]
        return [self.quarantines.pop(k) for k in sorted(keys)]


def _remove_one(times: deque[int] | None, t_ms: int) -> None:
    if times is not None and t_ms in times:
        times.remove(t_ms)
