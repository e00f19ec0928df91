"""The simulated network: who can reach whom, and how long a message takes.

The network is two kinds of star. A management switch joins the controller and every node
(control traffic: registration, heartbeats, assignments); one switch per InfiniBand fabric joins
that fabric's nodes (a replica's rendezvous between its shards). Every link takes
`MGMT_LINK_MS` or `FABRIC_LINK_MS`, so a message takes two links: small, fixed, deterministic
integer milliseconds. A cut link (partition, fabric down) is a link missing from its star, so
reachability is a set lookup and no path search is ever needed: a message between two nodes
never crosses from one star to the other (control traffic never crosses a fabric switch, and
fabrics are separate networks). A spine down splits a fabric's star into islands (`split`).
"""

from __future__ import annotations

from llmgw_twin.control.model import FabricId, NodeId

MGMT_LINK_MS = 1
FABRIC_LINK_MS = 1


class Network:
    def __init__(self, fabrics: tuple[tuple[FabricId, tuple[NodeId, ...]], ...]) -> None:
        self._fabric_of: dict[NodeId, FabricId] = {}
        self._members: dict[FabricId, list[NodeId]] = {}
        for fabric, nodes in fabrics:
            for node in nodes:
                self._fabric_of[node] = fabric
            self._members.setdefault(fabric, []).extend(nodes)
        self._mgmt_cut: set[NodeId] = set()
        """Nodes whose management link is cut: the controller does not reach them."""
        self._fabric_cut: set[NodeId] = set()
        """Nodes whose link to their fabric's switch is down (its own link, or the fabric)."""
        self._link_cuts: dict[NodeId, int] = {}
        """Nodes whose own fabric link is cut (`cut_fabric_link`), by outages still running."""
        self._down: set[FabricId] = set()
        """Fabrics whose links are all down (`fabric_down`)."""
        self.splits = SpineSplits()
        """Spines down (`spine_down`)."""

    def fabric_of(self, node: NodeId) -> FabricId:
        return self._fabric_of[node]

    def control_latency_ms(self, node: NodeId) -> int | None:
        """One-way latency between `node` and the controller; None when cut off."""
        if node not in self._fabric_of or node in self._mgmt_cut:
            return None
        return 2 * MGMT_LINK_MS

    def fabric_latency_ms(self, a: NodeId, b: NodeId) -> int | None:
        """One-way latency between two nodes over their fabric; None when not joined by one."""
        fabric = self._fabric_of[a]
        if self._fabric_of[b] != fabric:
            return None  # fabrics are separate networks
        if self.splits.apart(a, b):
            return None  # a spine down split the fabric between them
        if a == b:
            return 0
        if a in self._fabric_cut or b in self._fabric_cut:
            return None
        return 2 * FABRIC_LINK_MS

    def cut_from_controller(self, node: NodeId) -> None:
        self._mgmt_cut.add(node)

    def rejoin_controller(self, node: NodeId) -> None:
        self._mgmt_cut.discard(node)

    def fabric_links(self, fabric: FabricId) -> list[NodeId]:
        return sorted(self._members.get(fabric, []))

    def fabric_link_up(self, node: NodeId) -> bool:
        """The node's link to its fabric's switch is up (its InfiniBand ports are active)."""
        return node not in self._fabric_cut

    def cut_fabric(self, fabric: FabricId) -> None:
        self._down.add(fabric)
        self._fabric_cut.update(self._members.get(fabric, ()))

    def restore_fabric(self, fabric: FabricId) -> None:
        """The fabric is back: every link of it whose node's own link is not cut as well."""
        self._down.discard(fabric)
        for node in self.fabric_links(fabric):
            if not self._link_cuts.get(node):
                self._fabric_cut.discard(node)

    def cut_link(self, node: NodeId) -> bool:
        """One node's fabric link goes down (outages of it overlap: it comes back with the
        last); True when it was up until now."""
        was_up = self.fabric_link_up(node)
        self._link_cuts[node] = self._link_cuts.get(node, 0) + 1
        self._fabric_cut.add(node)
        return was_up

    def restore_link(self, node: NodeId) -> bool:
        """An outage of the node's own link ends; True when its link is back (the last one
        ended and its fabric is not down)."""
        self._link_cuts[node] -= 1
        if self._link_cuts[node] or self._fabric_of[node] in self._down:
            return False
        del self._link_cuts[node]
        self._fabric_cut.discard(node)
        return True

    def split(self, spine: str, leaf_of: dict[NodeId, str]) -> None:
        self.splits.split(spine, leaf_of)

    def join_split(self, spine: str) -> None:
        self.splits.join(spine)


class SpineSplits:
    """The spines down in a fabric (`spine_down`), counted: each node under one of them reaches
    only the nodes of its own leaf, the rest of the fabric stays joined. The twin's network and
    real mode's fabric proxies (`realmode/fabric.py`) both ask it."""

    def __init__(self) -> None:
        self._splits: dict[str, tuple[int, dict[NodeId, str]]] = {}
        """Outages running per spine, and the leaf each node under it is left with."""
        self._island: dict[NodeId, str] = {}
        """Nodes cut off by a spine down: the island (spine and leaf) they still reach."""

    def apart(self, a: NodeId, b: NodeId) -> bool:
        """A split stands between the two nodes."""
        return bool(self._island) and self._island.get(a, "") != self._island.get(b, "")

    def split(self, spine: str, leaf_of: dict[NodeId, str]) -> None:
        """A spine is down: each node of `leaf_of` reaches only the nodes of its own leaf (a
        spine down again while down changes nothing more)."""
        count = self._splits.get(spine, (0, leaf_of))[0]
        self._splits[spine] = (count + 1, leaf_of)
        self._islands()

    def join(self, spine: str) -> None:
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
