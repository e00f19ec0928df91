"""One node of a real run's cluster (`cluster.py`): its address, its wiring, its processes' power.

Role: `RealCluster.prepare_nodes` has `wire_node` make each node's sysfs-shaped root, its pair
of cuttable proxies to the first controller (one per direction) and one to each controller after
it, and its agent's config; `NodeProcs` then holds the node's agent process, every process group
it was seen running, and those links. A partition cuts the links (`cut`, `heal`); the node's
power is signals to its process groups: powered off (`power_off`: SIGSTOP, sockets left open),
crashed (`crash`: SIGKILL, the kernel closes them), a powered-off node's groups ended for good
when it boots again or the run ends (`thaw_dead`).

Invariants: every group found among a node's processes is added to the cluster's
`started_groups` (the agent's own was at its start), so the run's end (`RealCluster.stop_all`)
ends it too; the agent is stopped before its children are looked for, so it starts nothing in
between; the agent's own port is the last of the node's leased range, its shards' the rest.
"""

from __future__ import annotations

import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from llmgw_twin.control.model import NodeId, NodeInfo
from llmgw_twin.realmode.configs import AgentWiring, agent_config
from llmgw_twin.realmode.procs import children_groups
from llmgw_twin.realmode.procs import killpg as _killpg
from llmgw_twin.realmode.proxy import CuttableProxy
from llmgw_twin.service.agent.fakesysfs import fabric_prefix_for, write_sysfs_root

if TYPE_CHECKING:
    from llmgw_twin.realmode.cluster import RealCluster

STOP_GRACE_S = 10.0


def node_address(run_slot: int, index: int) -> str:
    """Node i's own loopback address in a run's block: 127.(10 + slot/250).(slot%250).(i+1)."""
    if not 0 <= index < 254:
        raise ValueError("real mode runs at most 254 nodes on one machine")
    return f"127.{10 + run_slot // 250 % 200}.{run_slot % 250}.{index + 1}"


@dataclass
class NodeProcs:
    name: NodeId
    index: int
    config: Path
    agent_port: int
    to_controller: CuttableProxy
    to_agent: CuttableProxy
    proc: subprocess.Popen[bytes] | None = None
    groups: set[int] = field(default_factory=set)
    """Every process group this node's agent was seen running (its own and its shards')."""
    frozen: set[int] = field(default_factory=set)
    """The groups of a powered-off node: stopped (SIGSTOP), sockets still open, until the node
    boots again or the run ends."""
    to_others: list[CuttableProxy] = field(default_factory=list)
    """Its links to the controllers after c1 (c2, c3, ...: `controllers.py`)."""

    def cut(self) -> None:
        """A partition: every link of the node with the controllers, both ways."""
        for proxy in (self.to_controller, self.to_agent, *self.to_others):
            proxy.cut()

    def heal(self) -> None:
        for proxy in (self.to_controller, self.to_agent, *self.to_others):
            proxy.heal()

    def power_off(self, started_groups: set[int]) -> None:
        """Power off: the agent and every engine and sidecar it started stop at once and say
        nothing more, but, as with a machine that lost power, no socket of theirs is closed
        (SIGSTOP, not SIGKILL): a peer engine on another node does not notice, and the node's
        loss is found by the controller's heartbeat timeout, as in the twin. The agent is frozen
        first, so it cannot start anything between the reading of its children and theirs;
        its children are found in /proc by parent, not by asking it. The frozen groups are
        killed when the node boots again or the run ends."""
        if self.proc is None:
            return
        self.frozen |= freeze(self.proc.pid, started_groups)
        self.proc = None

    def crash(self, started_groups: set[int]) -> None:
        """Crash: every process of the node dies at once (SIGKILL), so the kernel closes their
        sockets and a peer engine on another node sees its connection end."""
        if self.proc is None:
            return
        for pgid in sorted(freeze(self.proc.pid, started_groups)):
            _killpg(pgid, signal.SIGKILL)
        self.proc.wait(timeout=STOP_GRACE_S)
        self.proc = None

    def thaw_dead(self) -> None:
        """End a powered-off node's frozen processes for good (SIGKILL works on stopped ones)."""
        for pgid in sorted(self.frozen):
            _killpg(pgid, signal.SIGKILL)
        self.frozen.clear()


def freeze(agent_pid: int, started_groups: set[int]) -> set[int]:
    """Stop the agent first (it can start nothing more), then every process group of its
    children (found in /proc by parent); returns the groups, all stopped, and added to
    `started_groups`."""
    _killpg(agent_pid, signal.SIGSTOP)
    groups = {agent_pid, *children_groups(agent_pid)}
    started_groups |= groups
    for pgid in sorted(groups):
        _killpg(pgid, signal.SIGSTOP)
    return groups


async def wire_node(
    cluster: RealCluster,
    index: int,
    info: NodeInfo,
    root: Path,
    address: str,
    engine_binaries: dict[str, dict[str, str]],
    models: list[str],
) -> NodeProcs:
    """The node's root, its proxies to the controllers (started) and its agent's config
    (written), at `index` of the scenario's nodes; its agent is not started."""
    assert cluster.fabrics is not None  # (`prepare_nodes` started them)
    write_sysfs_root(
        root, gpus=info.gpus, fabric_prefix=fabric_prefix_for(info.fabric), node=info.node
    )
    first, last = cluster.ports.range_of(index)
    agent_port, last = last, last - 1  # the agent's own, the rest its shards'
    to_controller = CuttableProxy("127.0.0.1", cluster.controller_port)
    to_agent = CuttableProxy("127.0.0.1", agent_port)
    await to_controller.start()
    await to_agent.start()
    others = [CuttableProxy("127.0.0.1", int(u.rsplit(":", 1)[1])) for u in cluster._others()]
    for proxy in others:
        await proxy.start()
    engines = {e: engine_binaries[e] for e in info.engines if e in engine_binaries}
    config = agent_config(
        cluster.scenario,
        info,
        AgentWiring(
            controller=f"http://127.0.0.1:{to_controller.port}",
            controllers=[f"http://127.0.0.1:{p.port}" for p in others],
            port=agent_port,
            advertise=f"http://127.0.0.1:{to_agent.port}",
            ports=(first, last),
            address=address,
            peers=cluster.fabrics.peer_addresses(info.node),
        ),
        root,
        cluster.workdir,
        cluster._credential_path(info.node),
        engines,
        models,
    )
    path = cluster.workdir / f"agent-{info.node}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=True))
    return NodeProcs(info.node, index, path, agent_port, to_controller, to_agent, to_others=others)
