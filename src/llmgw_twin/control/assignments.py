"""What each node should run, and what it last said it runs.

`Assignments` owns, per node: the shard specs the controller wants there (the `AssignShards` it
sends is always this whole set), the node's last full report (kept until its assignment
changes, so an unchanged heartbeat costs one comparison), whether that report disagreed with the
assignment, and which nodes must be told their set at the next tick (dirty).

Invariants: a spec is assigned to exactly the node it names; any change to a node's assignment
forgets its last report and marks it dirty, so the next report is judged afresh and the node is
told its new set.
"""

from __future__ import annotations

from llmgw_twin.control.model import NodeId, ReplicaId, ShardKey, ShardReport, ShardSpec


class Assignments:
    def __init__(self) -> None:
        self._by_node: dict[NodeId, dict[ShardKey, ShardSpec]] = {}
        self._last_report: dict[NodeId, tuple[ShardReport, ...]] = {}
        self._out_of_sync: set[NodeId] = set()
        self.dirty: set[NodeId] = set()

    def track(self, node: NodeId) -> None:
        self._by_node.setdefault(node, {})

    def of(self, node: NodeId) -> tuple[ShardSpec, ...]:
        wanted = self._by_node.get(node, {})
        return tuple(wanted[k] for k in sorted(wanted))

    def keys(self, node: NodeId) -> dict[ShardKey, ShardSpec]:
        """The node's assignment by shard key (read-only by convention)."""
        return self._by_node.get(node, {})

    def replicas_on(self, node: NodeId) -> list[ReplicaId]:
        return sorted({k.replica for k in self._by_node.get(node, {})})

    def forget(self, node: NodeId) -> None:
        self._by_node.pop(node, None)
        self._last_report.pop(node, None)
        self._out_of_sync.discard(node)
        self.dirty.discard(node)

    def add(self, spec: ShardSpec) -> None:
        self._by_node[spec.node][spec.key] = spec
        self._last_report.pop(spec.node, None)
        self.dirty.add(spec.node)

    def restore(self, spec: ShardSpec) -> None:
        """A restored placement: the node is told nothing until it has reported."""
        self._by_node[spec.node][spec.key] = spec

    def drop(self, spec: ShardSpec) -> None:
        self._by_node[spec.node].pop(spec.key, None)
        self._last_report.pop(spec.node, None)
        self.dirty.add(spec.node)

    def forget_report(self, node: NodeId) -> None:
        """Judge the node's next report afresh (it registered again)."""
        self._last_report.pop(node, None)

    def unchanged(self, node: NodeId, shards: tuple[ShardReport, ...]) -> bool:
        """The same report as last time, against the same assignment: nothing to look at (a
        node still out of sync is told its set again)."""
        if self._last_report.get(node) != shards:
            return False
        if node in self._out_of_sync:
            self.dirty.add(node)
        return True

    def record_report(self, node: NodeId, shards: tuple[ShardReport, ...]) -> None:
        self._last_report[node] = shards
        self._out_of_sync.discard(node)

    def out_of_sync(self, node: NodeId) -> None:
        self._out_of_sync.add(node)
        self.dirty.add(node)

    def take_dirty(self) -> list[NodeId]:
        nodes = sorted(self.dirty)
        self.dirty.clear()
        return nodes
