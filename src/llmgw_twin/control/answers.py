"""When a restarted controller may judge first: once the agents it asked have answered.

A controller that restarts from its store asks every known agent to report (`Controller.start`)
and judges nothing (silence, adoption, capacity) before the agents could answer. The wait is
counted from when the requests were delivered, not from when they were decided or queued: a
fleet's requests leave a bounded set of connections over time, and a node asked late must not be
judged silent before its answer could arrive. The first judgement comes at the first reconcile
at or after one interval past the start at which every node asked (that was not already lost)

- has been heard since the start, or
- had its request delivered (or its send failed: `delivered`) one reconcile interval ago, or
- has not been heard for `node_suspect_after` since the start, whatever the shell said (a
  shell that never says, a send stuck on a dead link: the wait is bounded).

A shell that delivers nothing asynchronously says nothing: its requests count as delivered at
the start (`Controller.start(awaits_delivery=False)`), and the first judgement comes one interval
after it. Each waiting reconcile costs O(nodes not heard yet), and only until the first
judgement.

Pure: times are integer milliseconds handed in by the core.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from llmgw_twin.control.model import NodeId, Timings


class FirstJudgement:
    def __init__(self, timings: Timings) -> None:
        self._interval = timings.reconcile_interval_ms
        self._cap = max(timings.node_suspect_after_ms, timings.reconcile_interval_ms)
        self._asked: dict[NodeId, int | None] = {}
        """Each node asked and not heard yet -> when its request was delivered (None: not yet
        said)."""
        self._start_ms = 0
        self._done = True

    def asked(self, now_ms: int, nodes: Iterable[NodeId], awaits_delivery: bool) -> None:
        """The controller started at `now_ms` and asked `nodes` to report; `awaits_delivery`:
        the shell says when each request was delivered (`delivered`), else they count as
        delivered now."""
        when = None if awaits_delivery else now_ms
        self._asked = dict.fromkeys(sorted(nodes), when)
        self._start_ms = now_ms
        self._done = False

    def delivered(self, node: NodeId, now_ms: int) -> None:
        """`node`'s request was delivered (or its send failed) by `now_ms`."""
        if not self._done and node in self._asked and self._asked[node] is None:
            self._asked[node] = now_ms

    def wait_until(self, now_ms: int, heard: Collection[NodeId]) -> int | None:
        """None when the controller may judge now (and from then on); otherwise the time to
        look again at the latest (an answer may end the wait sooner, at a reconcile)."""
        if self._done:
            return None
        floor = self._start_ms + self._interval
        if now_ms < floor:
            return floor
        deadline = floor
        for node, when in list(self._asked.items()):
            if node in heard:
                del self._asked[node]  # answered
                continue
            due = self._start_ms + self._cap if when is None else when + self._interval
            deadline = max(deadline, min(due, self._start_ms + self._cap))
        if now_ms >= deadline:
            self._done = True
            self._asked = {}
            return None
        return deadline

    def unanswered(self, heard: Collection[NodeId]) -> list[NodeId]:
        """The nodes asked that have not answered yet (while waiting)."""
        return [n for n in self._asked if n not in heard] if not self._done else []
