"""What recent failures teach placement: back-off, quarantine, and nodes not heard since.

`FailureBook` keeps, within the failure window:
- each model's recent replica failures (crashes, not node losses): the n-th failure in the
  window delays the next replacement by `restart_backoff * 2**(n-2)`, capped, so a crash loop
  slows down exponentially while a single failure is replaced at once;
- each (node, profile)'s recent failures: at `quarantine_after` of them the node is quarantined
  for that profile until `quarantine_for` has passed (or an operator clears it), so the
  replacement goes elsewhere;
- the nodes of every failed replica that have not been heard from since it failed: a replacement
  avoids them (a node whose shard just died may itself be dead, not yet declared lost).

Invariants: the window only drops old entries (deterministic, no clock read); a quarantine's
`until_ms` never moves earlier except by an operator's clear.
"""

from __future__ import annotations

from collections import deque

from llmgw_twin.control.durable import PutModelFailures, PutNodeFailures, QuarantineRow
from llmgw_twin.control.model import ModelName, NodeId, ProfileName, Timings


class FailureBook:
    def __init__(self, timings: Timings) -> None:
        self.timings = timings
        self._by_model: dict[ModelName, deque[int]] = {}
        self._by_node: dict[tuple[NodeId, ProfileName], deque[int]] = {}
        self.quarantines: dict[tuple[NodeId, ProfileName], QuarantineRow] = {}
        self._unheard: dict[NodeId, int] = {}
        """node -> when a replica with a shard on it failed; cleared when it is heard after."""

    def _trim(self, times: deque[int], now_ms: int) -> None:
        while times and now_ms - times[0] >= self.timings.failure_window_ms:
            times.popleft()

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
    ) -> list[QuarantineRow]:
        """Record one failure; returns the quarantines it starts. `blamed`: the nodes whose
        shards failed; `nodes`: every node of the replica; `reporter`: the node whose report
        showed the failure (it just spoke); `crash`: counts toward back-off."""
        if not crash:
            return []
        for node in nodes:
            if node != reporter:
                self._unheard[node] = now_ms
        times = self._by_model.setdefault(model, deque())
        times.append(now_ms)
        self._trim(times, now_ms)
        started: list[QuarantineRow] = []
        for node in sorted(set(blamed)):
            key = (node, profile)
            failures = self._by_node.setdefault(key, deque())
            failures.append(now_ms)
            self._trim(failures, now_ms)
            if len(failures) >= self.timings.quarantine_after and key not in self.quarantines:
                row = QuarantineRow(
                    node,
                    profile,
                    now_ms + self.timings.quarantine_for_ms,
                    f"{len(failures)} failures of {profile} on {node} within "
                    f"{self.timings.failure_window_ms // 1000}s",
                )
                self.quarantines[key] = row
                failures.clear()
                started.append(row)
        return started

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
        back-off and quarantines on from there, not from zero."""
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
        n = len(times)
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
