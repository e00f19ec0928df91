"""The fabrics of a real run: the engines' peer traffic through cuttable proxies, and the ports.

On one machine every node is a loopback address, so nothing stands between two nodes' engines
that a `fabric_down` could cut. Here each node of a fabric where multi-node replicas can run
gets a second address, its fabric address (127.C.B.N, the C block apart from the engines'), and
on it one refusing proxy (`proxy.CuttableProxy`, `refuse_when_cut`) per port a peer may dial
there: the rendezvous port of each GPU (`RENDEZVOUS_PORT_BASE + g`, where a sim or vLLM leader
listens) and, when llama.cpp replicas span nodes, each RPC port (`RPC_PORT_BASE + g`). Every other
node's agent is told (`peer_addresses`) to reach the node there; the node itself binds at its
engine address. So a fabric's outage is real: its proxies close every open peer connection (the
sim engine's ranks see their peer go and exit 1) and refuse new ones until it is back (a worker
started meanwhile keeps dialling its leader, and joins when the links return).

The InfiniBand ports go down with it: each node's sysfs-shaped root shows `1: DOWN`
(`fakesysfs.set_port_state`), which its agent reads (`service/agent/node_watch.py`) and reports.

One node's link (`cut_fabric_link`, and each node under a leaf that is down) and a spine's split
are cut at the same proxies, by who dials: a sim engine's worker dials its leader from its
node's engine address (`--source-host`), so the proxy in front of a node's port knows the
dialling node by the connection's source address and admits it only while the two reach each
other (`reaches`): neither one's link down, and on one side of every split. A node whose link
is down shows its ports `DOWN` as in a fabric outage; a split leaves every port up.

Invariants: overlapping outages of one fabric, of one node's link and of one spine end with the
last (`down` and `up`, `cut_link` and `heal_link`, `split` and `join_split` count them); the
proxies listen on this run's own addresses only, and `close` ends all of them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from llmgw_twin.control.model import RENDEZVOUS_PORT_BASE, FabricId, NodeId
from llmgw_twin.engines.llamacpp import RPC_PORT_BASE
from llmgw_twin.realmode.proxy import CuttableProxy
from llmgw_twin.service.agent.fakesysfs import set_port_state
from llmgw_twin.twin.scenario.model import Scenario
from llmgw_twin.twin.world.network import SpineSplits


def fabric_address(run_slot: int, index: int) -> str:
    """Node i's fabric address: 127.(210 + slot/250 % 45).(slot % 250).(i+1), a block no run's
    engine addresses (127.10-209.x.x, `cluster.node_address`) use."""
    if not 0 <= index < 254:
        raise ValueError("real mode runs at most 254 nodes on one machine")
    return f"127.{210 + run_slot // 250 % 45}.{run_slot % 250}.{index + 1}"


class RealFabrics:
    def __init__(
        self,
        scenario: Scenario,
        roots: dict[NodeId, Path],
        engine_addresses: dict[NodeId, str],
        run_slot: int,
    ) -> None:
        self.scenario = scenario
        self.roots = roots
        self.engine_addresses = engine_addresses
        multi = [p for p in scenario.profiles if p.nodes > 1]
        self._bases = [RENDEZVOUS_PORT_BASE] if multi else []
        if any(p.engine == "llamacpp" for p in multi):
            self._bases.append(RPC_PORT_BASE)
        self.fabric_of = {n.node: n.fabric for n in scenario.all_nodes}
        self.addresses: dict[NodeId, str] = {}
        """Where peers reach each node's engines: its fabric address when it has proxies."""
        self.proxies: dict[FabricId, list[CuttableProxy]] = {}
        self._downs: dict[FabricId, int] = {}
        self._node_at = {address: node for node, address in engine_addresses.items()}
        self._link_cuts: dict[NodeId, int] = {}
        self._severed: set[NodeId] = set()
        self._splits = SpineSplits()
        for i, info in enumerate(scenario.all_nodes):
            fabric_nodes = dict(scenario.all_fabrics)[info.fabric]
            if self._bases and len(fabric_nodes) > 1 and info.gpus > 0:
                self.addresses[info.node] = fabric_address(run_slot, i)

    async def start(self) -> None:
        for info in self.scenario.all_nodes:
            address = self.addresses.get(info.node)
            if address is None:
                continue
            for base in self._bases:
                for g in range(info.gpus):
                    proxy = CuttableProxy(
                        self.engine_addresses[info.node],
                        base + g,
                        refuse_when_cut=True,
                        admit=self._admits(info.node),
                    )
                    await proxy.start(address, base + g)
                    self.proxies.setdefault(info.fabric, []).append(proxy)

    def peer_addresses(self, node: NodeId) -> dict[str, str]:
        """What `node`'s agent is told of every node: itself at its engine address (where its
        engines bind), a peer of its fabric at the peer's fabric address, others as they are."""
        out: dict[str, str] = {}
        for peer, engine_address in self.engine_addresses.items():
            same = self.fabric_of[peer] == self.fabric_of[node]
            fabric_side = self.addresses.get(peer) if peer != node and same else None
            out[peer] = fabric_side or engine_address
        return out

    def down(self, fabric: FabricId) -> bool:
        """An outage begins; True when the links were up until now."""
        self._downs[fabric] = self._downs.get(fabric, 0) + 1
        return self._downs[fabric] == 1

    def up(self, fabric: FabricId) -> bool:
        """An outage ends; True when it was the last one, so the links are back."""
        self._downs[fabric] -= 1
        return self._downs[fabric] == 0

    def is_down(self, fabric: FabricId) -> bool:
        return self._downs.get(fabric, 0) > 0

    def set_ports(self, fabric: FabricId, up: bool) -> None:
        """Every node of the fabric shows its InfiniBand ports down, or up again."""
        for node, f in sorted(self.fabric_of.items()):
            if f == fabric and not (up and self._link_cuts.get(node)):
                set_port_state(self.roots[node], up)  # (a node's own link outage outlasts it)

    def cut(self, fabric: FabricId) -> None:
        for proxy in self.proxies.get(fabric, []):
            proxy.cut()

    def heal(self, fabric: FabricId) -> None:
        for proxy in self.proxies.get(fabric, []):
            proxy.heal()

    # --- one node's link, a spine's split -----------------------------------------------------

    def reaches(self, a: NodeId, b: NodeId) -> bool:
        """Whether `a`'s traffic reaches `b` over their fabric (a fabric outage aside)."""
        if a in self._severed or b in self._severed:
            return False
        return not self._splits.apart(a, b)

    def _admits(self, target: NodeId) -> Callable[[str], bool]:
        def admit(source: str) -> bool:
            dialler = self._node_at.get(source)
            # a source that is no node of this run (127.0.0.1: an engine that binds no source
            # address) is admitted: only a fabric outage cuts it
            return dialler is None or self.reaches(dialler, target)

        return admit

    def _enforce(self) -> None:
        for proxies in self.proxies.values():
            for proxy in proxies:
                proxy.enforce()

    def cut_link(self, node: NodeId) -> bool:
        """The node's own fabric link goes down: its ports show it (`sever` then parts it from
        its peers); True when it was up until now."""
        self._link_cuts[node] = self._link_cuts.get(node, 0) + 1
        if self._link_cuts[node] > 1:
            return False
        set_port_state(self.roots[node], False)
        return True

    def sever(self, node: NodeId) -> None:
        """No peer reaches the node nor it them: open peer connections closed, new refused."""
        self._severed.add(node)
        self._enforce()

    def heal_link(self, node: NodeId) -> bool:
        """An outage of the node's link ends; True when its link is back (the last one ended;
        its ports show up unless its whole fabric is down)."""
        self._link_cuts[node] -= 1
        if self._link_cuts[node]:
            return False
        del self._link_cuts[node]
        self._severed.discard(node)
        if not self.is_down(self.fabric_of[node]):
            set_port_state(self.roots[node], True)
        return True

    def link_down(self, node: NodeId) -> bool:
        return bool(self._link_cuts.get(node))

    def split(self, spine: str, island_of: dict[NodeId, str]) -> None:
        """A spine is down: each node of `island_of` reaches only the nodes of its own island
        (its leaf), and the connections across are closed."""
        self._splits.split(spine, island_of)
        self._enforce()

    def join_split(self, spine: str) -> None:
        """An outage of the spine ends: with the last, its leaves reach the rest again."""
        self._splits.join(spine)

    async def close(self) -> None:
        for proxies in self.proxies.values():
            for proxy in proxies:
                await proxy.close()
