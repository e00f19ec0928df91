"""The simulated network: who can reach whom, and how long a message takes.

A networkx graph holds the controller, a management switch that every node hangs off, one switch
per InfiniBand fabric, and the nodes. Management links carry control traffic (registration,
heartbeats, assignments); fabric links carry a replica's rendezvous between its shards. Latency
is the weighted shortest path, in integer milliseconds: small, fixed, deterministic. A cut link
(partition, fabric down) is a removed edge, so reachability is a path query. Control latencies
come from one single-source search from the controller, fabric latencies from a search inside
one fabric; both are cached until the topology changes, so a fleet of 10,000 nodes costs one
search, not one per node.
"""

from __future__ import annotations

import networkx as nx

from llmgw_twin.control.model import FabricId, NodeId

CONTROLLER = "controller"
MGMT = "mgmt"
MGMT_LINK_MS = 1
FABRIC_LINK_MS = 1


def _fabric_vertex(fabric: FabricId) -> str:
    return f"fabric:{fabric}"


class Network:
    def __init__(self, fabrics: tuple[tuple[FabricId, tuple[NodeId, ...]], ...]) -> None:
        self._g: nx.Graph = nx.Graph()
        self._g.add_edge(CONTROLLER, MGMT, latency_ms=MGMT_LINK_MS)
        self._fabric_of: dict[NodeId, FabricId] = {}
        for fabric, nodes in fabrics:
            for node in nodes:
                self._fabric_of[node] = fabric
                self._g.add_edge(node, MGMT, latency_ms=MGMT_LINK_MS)
                self._g.add_edge(node, _fabric_vertex(fabric), latency_ms=FABRIC_LINK_MS)
        self._members: dict[FabricId, list[NodeId]] = {}
        for fabric, nodes in fabrics:
            self._members.setdefault(fabric, []).extend(nodes)
        self._control: dict[str, int] | None = None
        self._fabric_cache: dict[FabricId, dict[NodeId, int]] = {}
        self._link_cuts: dict[NodeId, int] = {}
        """Nodes whose own fabric link is cut (`cut_fabric_link`), by outages still running."""
        self._down: set[FabricId] = set()
        """Fabrics whose links are all down (`fabric_down`)."""
        self._splits: dict[str, tuple[int, dict[NodeId, str]]] = {}
        """Spines down (`spine_down`): outages running, and the leaf each node under it is left
        with."""
        self._island: dict[NodeId, str] = {}
        """Nodes cut off by a spine down: the island (spine and leaf) they still reach."""

    def fabric_of(self, node: NodeId) -> FabricId:
        return self._fabric_of[node]

    def control_latency_ms(self, node: NodeId) -> int | None:
        """One-way latency between `node` and the controller; None when cut off."""
        if self._control is None:
            # one single-source search from the controller answers every node until the
            # topology changes (control traffic never crosses a fabric switch)
            view = nx.subgraph_view(self._g, filter_node=lambda v: not v.startswith("fabric:"))
            lengths = nx.single_source_dijkstra_path_length(view, CONTROLLER, weight="latency_ms")
            self._control = {str(k): int(v) for k, v in lengths.items()}
        return self._control.get(node)

    def fabric_latency_ms(self, a: NodeId, b: NodeId) -> int | None:
        """One-way latency between two nodes over their fabric; None when not joined by one.

        A fabric is a switch with its nodes hanging off it, so one search from the switch
        gives every member's distance and a pair's latency is the sum of theirs."""
        fabric = self._fabric_of[a]
        if self._fabric_of[b] != fabric:
            return None  # fabrics are separate networks
        if self._island and self._island.get(a, "") != self._island.get(b, ""):
            return None  # a spine down split the fabric between them
        dist = self._fabric_cache.get(fabric)
        if dist is None:
            switch = _fabric_vertex(fabric)
            view = self._g.subgraph([*self._members[fabric], switch])
            found = nx.single_source_dijkstra_path_length(view, switch, weight="latency_ms")
            dist = {NodeId(str(k)): int(v) for k, v in found.items() if k != switch}
            self._fabric_cache[fabric] = dist
        if a == b:
            return 0
        if a not in dist or b not in dist:
            return None
        return dist[a] + dist[b]

    def _changed(self) -> None:
        self._control = None
        self._fabric_cache.clear()

    def cut(self, u: str, v: str) -> None:
        if self._g.has_edge(u, v):
            self._g.remove_edge(u, v)
            self._changed()

    def join(self, u: str, v: str, latency_ms: int) -> None:
        self._g.add_edge(u, v, latency_ms=latency_ms)
        self._changed()

    def cut_from_controller(self, node: NodeId) -> None:
        self.cut(node, MGMT)

    def rejoin_controller(self, node: NodeId) -> None:
        self.join(node, MGMT, MGMT_LINK_MS)

    def fabric_links(self, fabric: FabricId) -> list[NodeId]:
        return sorted(self._members.get(fabric, []))

    def fabric_link_up(self, node: NodeId) -> bool:
        """The node's link to its fabric's switch is up (its InfiniBand ports are active)."""
        return bool(self._g.has_edge(node, _fabric_vertex(self._fabric_of[node])))

    def cut_fabric(self, fabric: FabricId) -> None:
        self._down.add(fabric)
        for node in self.fabric_links(fabric):
            self.cut(node, _fabric_vertex(fabric))

    def restore_fabric(self, fabric: FabricId) -> None:
        """The fabric is back: every link of it whose node's own link is not cut as well."""
        self._down.discard(fabric)
        for node in self.fabric_links(fabric):
            if not self._link_cuts.get(node):
                self.join(node, _fabric_vertex(fabric), FABRIC_LINK_MS)

    def cut_link(self, node: NodeId) -> bool:
        """One node's fabric link goes down (outages of it overlap: it comes back with the
        last); True when it was up until now."""
        was_up = self.fabric_link_up(node)
        self._link_cuts[node] = self._link_cuts.get(node, 0) + 1
        self.cut(node, _fabric_vertex(self._fabric_of[node]))
        return was_up

    def restore_link(self, node: NodeId) -> bool:
        """An outage of the node's own link ends; True when its link is back (the last one
        ended and its fabric is not down)."""
        self._link_cuts[node] -= 1
        if self._link_cuts[node] or self._fabric_of[node] in self._down:
            return False
        del self._link_cuts[node]
        self.join(node, _fabric_vertex(self._fabric_of[node]), FABRIC_LINK_MS)
        return True

    def split(self, spine: str, leaf_of: dict[NodeId, str]) -> None:
        """A spine is down: each node of `leaf_of` reaches only the nodes of its own leaf (a
        spine down again while down changes nothing more)."""
        count = self._splits.get(spine, (0, leaf_of))[0]
        self._splits[spine] = (count + 1, leaf_of)
        self._islands()

    def join_split(self, spine: str) -> None:
        """An outage of the spine ends: with the last, its leaves reach the rest again."""
        count, leaf_of = self._splits[spine]
        if count > 1:
            self._splits[spine] = (count - 1, leaf_of)
            return
        del self._splits[spine]
        self._islands()

    def _islands(self) -> None:
        self._island = {
            node: f"{spine}/{leaf}"
            for spine, (_, leaf_of) in sorted(self._splits.items())
            for node, leaf in leaf_of.items()
        }
