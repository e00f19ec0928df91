"""Fabric faults done for real (`faults.py` hands them here): a whole fabric down, one node's
link down (`cut_fabric_link`), a leaf switch down and a spine down, on the fabric proxies and the
nodes' sysfs-shaped roots of a real run (`fabric.py`), as the twin models them
(`twin/world/topo_faults.py`).

- `fabric_down`: every node's ports go down, and once the controller shows the links down (the
  twin delivers the link state before the peers are lost), every proxy of the fabric is cut.
- `cut_fabric_link`: the node's ports go down, and once the controller shows it, no peer reaches
  the node nor it them (its engines' peer connections are closed, new ones refused).
- `leaf_down`: each node under the leaf is cut from the controller (a partition: the leaf carries
  the management links too) and its fabric link goes down at once (no report of it can get out).
- `spine_down`: the fabric splits between the spine's leaves; every link stays up.

Each outage ends after its `for`, with the last of overlapping ones of the same link.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import assert_never

import httpx

from llmgw_twin.control.model import FabricId, NodeId
from llmgw_twin.realmode.cluster import RealCluster
from llmgw_twin.realmode.fabric import RealFabrics
from llmgw_twin.service.agent.node_watch import poll_interval_ms
from llmgw_twin.twin.scenario.model import CutFabricLink, FabricDown, Scenario
from llmgw_twin.twin.scenario.topo_actions import LeafDown, SpineDown

LinkFault = FabricDown | CutFabricLink | LeafDown | SpineDown

LINK_POLL_S = 0.05
"""How often a link outage asks the controller whether the links-down reports arrived."""


class LinkFaults:
    def __init__(
        self,
        cluster: RealCluster,
        scenario: Scenario,
        progress: Callable[[str], None],
        partitioned: Callable[[NodeId], bool],
        partition: Callable[[tuple[NodeId, ...], int], None],
        tasks: set[asyncio.Task[None]],
        pending: list[asyncio.TimerHandle],
    ) -> None:
        self.cluster = cluster
        self.scenario = scenario
        self.progress = progress
        self.partitioned = partitioned
        """Whether a node is cut from the controller now (its reports cannot get out)."""
        self.partition = partition
        """Cut nodes from the controller for a while (`faults.py`'s partition)."""
        self.tasks = tasks
        self.pending = pending
        """The run's tasks and timers, which `RealFaults.cancel` ends with the run."""

    @property
    def fabrics(self) -> RealFabrics:
        assert self.cluster.fabrics is not None
        return self.cluster.fabrics

    def _task(self, work: Coroutine[object, object, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def inject(self, client: httpx.AsyncClient, action: LinkFault) -> None:
        match action:
            case FabricDown(fabric=fabric, for_ms=for_ms):
                self.fabric_down(client, fabric, for_ms)
            case CutFabricLink(node=node, for_ms=for_ms):
                self.link_down(client, node, for_ms)
            case LeafDown(nodes=nodes, for_ms=for_ms):
                self.partition(nodes, for_ms)  # the leaf carries the management links too
                self.leaf_down(nodes, for_ms)
            case SpineDown(spine=spine, leaves=leaves, for_ms=for_ms):
                self.spine_down(spine, leaves, for_ms)
            case _:
                assert_never(action)

    def _later(self, for_ms: int, undo: Callable[[], object]) -> None:
        self.pending.append(asyncio.get_running_loop().call_later(for_ms / 1000, undo))

    # --- a whole fabric ------------------------------------------------------------------------

    def fabric_down(self, client: httpx.AsyncClient, fabric: FabricId, for_ms: int) -> None:
        self._task(self._fabric_down(client, fabric))
        self._later(for_ms, lambda: self._fabric_up(fabric))

    async def _fabric_down(self, client: httpx.AsyncClient, fabric: FabricId) -> None:
        fabrics = self.fabrics
        if not fabrics.down(fabric):
            return  # down already: the outage lasts until the last one ends
        fabrics.set_ports(fabric, up=False)
        await self._links_reported(client, dict(self.scenario.all_fabrics)[fabric])
        if fabrics.is_down(fabric):
            fabrics.cut(fabric)

    def _fabric_up(self, fabric: FabricId) -> None:
        fabrics = self.fabrics
        if fabrics.up(fabric):  # overlapping outages: the links come back with the last
            fabrics.heal(fabric)
            fabrics.set_ports(fabric, up=True)

    # --- one node's link, a leaf -------------------------------------------------------------

    def link_down(self, client: httpx.AsyncClient, node: NodeId, for_ms: int) -> None:
        if self.fabrics.cut_link(node):
            self._task(self._sever_once_reported(client, node))
        self._later(for_ms, lambda: self.fabrics.heal_link(node))

    async def _sever_once_reported(self, client: httpx.AsyncClient, node: NodeId) -> None:
        await self._links_reported(client, (node,))
        if self.fabrics.link_down(node):
            self.fabrics.sever(node)

    def leaf_down(self, nodes: tuple[NodeId, ...], for_ms: int) -> None:
        """Called once the nodes are cut from the controller: their links go down at once."""
        for node in nodes:
            if self.fabrics.cut_link(node):
                self.fabrics.sever(node)
        self._later(for_ms, lambda: self._heal_links(nodes))

    def _heal_links(self, nodes: tuple[NodeId, ...]) -> None:
        for node in nodes:
            self.fabrics.heal_link(node)

    def spine_down(
        self, spine: str, leaves: tuple[tuple[str, tuple[NodeId, ...]], ...], for_ms: int
    ) -> None:
        islands = {node: leaf for leaf, members in leaves for node in members}
        self.fabrics.split(spine, islands)
        self._later(for_ms, lambda: self.fabrics.join_split(spine))

    async def _links_reported(self, client: httpx.AsyncClient, members: tuple[NodeId, ...]) -> None:
        """Until the controller shows the links down of every node of `members` whose agent
        runs and reaches it, or a few of the agents' reads have passed."""
        loop = asyncio.get_running_loop()
        reads_s = poll_interval_ms(self.scenario.timings.heartbeat_interval_ms) / 1000
        deadline = loop.time() + 3 * reads_s + 1.0
        nodes = {
            n for n in members if self.cluster.nodes[n].proc is not None and not self.partitioned(n)
        }
        url = f"{self.cluster.controller_url}/v1/admin/state"
        while loop.time() < deadline:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                r = await client.get(url)
                if r.status_code == 200:
                    up = {n["node"] for n in r.json()["nodes"] if n.get("fabric_link_up", True)}
                    if not nodes & up:
                        return
            await asyncio.sleep(LINK_POLL_S)
        shown = ", ".join(members)
        self.progress(f"{shown}: not every agent had reported its links down; cut anyway")
