"""The simulated network: who can reach whom, and how long a message takes.

A networkx graph holds the controller, a management switch that every node hangs off, one switch
per InfiniBand fabric, and the nodes. Management links carry control traffic (registration,
heartbeats, assignments); fabric links carry a replica's rendezvous between its shards. Latency
is the weighted shortest path, in integer milliseconds: small, fixed, deterministic. A cut link
(partition, fabric down) is a removed edge, so reachability is a path query, cached until the
topology changes.
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
        self._cache: dict[tuple[str, str, bool], int | None] = {}

    def fabric_of(self, node: NodeId) -> FabricId:
        return self._fabric_of[node]

    def control_latency_ms(self, node: NodeId) -> int | None:
        """One-way latency between `node` and the controller; None when cut off."""
        return self._latency(node, CONTROLLER, via_fabric=False)

    def fabric_latency_ms(self, a: NodeId, b: NodeId) -> int | None:
        """One-way latency between two nodes over their fabric; None when not joined by one."""
        return self._latency(a, b, via_fabric=True)

    def _latency(self, a: str, b: str, via_fabric: bool) -> int | None:
        key = (a, b, via_fabric)
        if key not in self._cache:
            self._cache[key] = self._path_ms(a, b, via_fabric)
        return self._cache[key]

    def _path_ms(self, a: str, b: str, via_fabric: bool) -> int | None:
        if a == b:
            return 0

        # control traffic never crosses a fabric switch, fabric traffic never the management one
        def allowed(v: str) -> bool:
            return v in (a, b) or (v.startswith("fabric:") if via_fabric else v in (MGMT,))

        view = nx.subgraph_view(self._g, filter_node=allowed)
        try:
            return int(nx.shortest_path_length(view, a, b, weight="latency_ms"))
        except (nx.NetworkXNoPath, nx.NodeNotFound):
            return None

    def cut(self, u: str, v: str) -> None:
        if self._g.has_edge(u, v):
            self._g.remove_edge(u, v)
            self._cache.clear()

    def join(self, u: str, v: str, latency_ms: int) -> None:
        self._g.add_edge(u, v, latency_ms=latency_ms)
        self._cache.clear()

    def cut_from_controller(self, node: NodeId) -> None:
        self.cut(node, MGMT)

    def rejoin_controller(self, node: NodeId) -> None:
        self.join(node, MGMT, MGMT_LINK_MS)

    def fabric_links(self, fabric: FabricId) -> list[NodeId]:
        return sorted(n for n, f in self._fabric_of.items() if f == fabric)

    def cut_fabric(self, fabric: FabricId) -> None:
        for node in self.fabric_links(fabric):
            self.cut(node, _fabric_vertex(fabric))

    def restore_fabric(self, fabric: FabricId) -> None:
        for node in self.fabric_links(fabric):
            self.join(node, _fabric_vertex(fabric), FABRIC_LINK_MS)
