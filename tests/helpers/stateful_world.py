"""Ground truth for the stateful test of the controller and agent cores (`test_stateful.py`).

The world is what really is, kept apart from what either core believes: each node's power, its
real fabric and GPU count, the GPUs that really failed, the engine processes it really runs and
what it last told a controller. A process exists from the agent's `StartSidecar` until the world
delivers `ShardStopped` with the `StopShard`'s token (a stop is slow: the process keeps its GPUs
until then), or until its node loses power. The world carries out the agent's commands and
answers them only when a rule says so, so every interleaving is the rules' to choose.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from llmgw_twin.control.agent import AgentCore
from llmgw_twin.control.model import (
    EngineName,
    FabricId,
    NodeId,
    NodeInfo,
    ShardKey,
    ShardReport,
    ShardSpec,
)
from llmgw_twin.control.protocol import (
    AgentEvent,
    Heartbeat,
    SendReport,
    StartEngine,
    StartSidecar,
    StopShard,
)

GPU_MEMORY_MIB = 81920
ENGINES = (EngineName("sim"),)


def endpoint_of(node: NodeId) -> str:
    """Where a leader on `node` really answers."""
    return f"http://{node}:8000"


class Stage(enum.Enum):
    """What a shard's processes really are doing (the world's view, not the agent's)."""

    SIDECAR = "sidecar"  # sidecar starting
    LAUNCHING = "launching"  # sidecar up, engine asked for
    ENGINE = "engine"  # engine process started, loading / joining
    RUNNING = "running"  # a worker that joined
    SERVING = "serving"  # a leader that answers
    UNRESPONSIVE = "unresponsive"  # a leader alive but not answering its probe
    EXITED = "exited"  # the engine ended; the sidecar (and GPU memory) until stopped


ENGINE_STAGES = frozenset(
    {Stage.LAUNCHING, Stage.ENGINE, Stage.RUNNING, Stage.SERVING, Stage.UNRESPONSIVE}
)
"""Stages in which an engine process exists (or is being spawned) and can exit."""


@dataclass(slots=True)
class Proc:
    """One shard's processes on one node."""

    pid: int
    spec: ShardSpec
    stage: Stage = Stage.SIDECAR
    stop_token: int | None = None
    """Set once the agent said `StopShard`: it holds its GPUs until the stop completes."""

    @property
    def key(self) -> ShardKey:
        return self.spec.key

    @property
    def stopping(self) -> bool:
        return self.stop_token is not None

    def __str__(self) -> str:
        stop = f", stopping (token {self.stop_token})" if self.stopping else ""
        gpus = ",".join(map(str, self.spec.gpus))
        where = f"{self.key.replica}/{self.key.rank}@{self.spec.node}"
        return f"{where}[gpus {gpus}; {self.stage.value}{stop}]"


@dataclass(slots=True)
class NodeTruth:
    name: NodeId
    fabric: FabricId
    gpus: int
    up: bool = False
    agent: AgentCore | None = None
    incarnation: int = 0
    failed: set[int] = field(default_factory=set)
    procs: list[Proc] = field(default_factory=list)
    asked: bool = False
    """A controller asked this node to report (`RequestReport`) and it has not answered yet."""
    delivered: dict[ShardKey, ShardReport] = field(default_factory=dict)
    """This node's own shards as it last reported them to a controller."""
    in_flight: list[Heartbeat] = field(default_factory=list)
    """Heartbeats sent and not yet delivered, oldest first (one connection: in order)."""
    link_up: bool = True

    def info(self) -> NodeInfo:
        return NodeInfo(self.name, self.fabric, self.gpus, GPU_MEMORY_MIB, ENGINES)

    def live_proc(self, key: ShardKey) -> Proc | None:
        """The process of `key` not being stopped (at most one: see `World.do`)."""
        found = [p for p in self.procs if p.key == key and not p.stopping]
        assert len(found) <= 1, f"{self.name} runs {key} twice: {', '.join(map(str, found))}"
        return found[0] if found else None


class World:
    def __init__(self, nodes: tuple[tuple[str, str, int], ...]) -> None:
        self.nodes: dict[NodeId, NodeTruth] = {
            NodeId(name): NodeTruth(NodeId(name), FabricId(fabric), gpus)
            for name, fabric, gpus in nodes
        }
        self.fabrics = sorted({n.fabric for n in self.nodes.values()})
        self._pid = 0

    def up_nodes(self) -> list[NodeTruth]:
        return [self.nodes[n] for n in sorted(self.nodes) if self.nodes[n].up]

    def procs(self) -> list[Proc]:
        """Every process on every node that is up, by node then key then age."""
        return [p for n in self.up_nodes() for p in sorted(n.procs, key=lambda p: (p.key, p.pid))]

    def boot(self, node: NodeTruth) -> None:
        """Power on empty: a new agent process whose inventory finds the failed GPUs failed."""
        assert not node.up
        node.up = True
        node.incarnation += 1
        node.agent = AgentCore(
            node.info(), node.incarnation, failed_gpus=tuple(sorted(node.failed))
        )

    def kill(self, node: NodeTruth) -> None:
        """Power off: the agent and every process on the node are gone at once."""
        node.up, node.agent, node.asked = False, None, False
        node.procs.clear()
        node.in_flight.clear()  # lost with the connection

    def do(self, node: NodeTruth, event: AgentEvent) -> list[str]:
        """Hand `event` to the node's agent and carry out what it says; returns what happened."""
        assert node.up and node.agent is not None, f"delivery to {node.name}, which is down"
        done: list[str] = []
        for cmd in node.agent.handle(event).commands:
            match cmd:
                case StartSidecar(spec=spec):
                    assert spec.node == node.name, f"{node.name} told to run {spec.node}'s shard"
                    assert node.live_proc(spec.key) is None, f"{spec.key} started twice"
                    self._pid += 1
                    proc = Proc(self._pid, spec)
                    node.procs.append(proc)
                    done.append(f"start {proc}")
                case StartEngine(spec=spec):
                    live = node.live_proc(spec.key)
                    assert live is not None and live.stage is Stage.SIDECAR, (
                        f"engine of {spec.key} started on {node.name} without its sidecar up"
                    )
                    live.stage = Stage.LAUNCHING
                case StopShard(key=key, token=token):
                    live = node.live_proc(key)
                    assert live is not None, f"{node.name} told to stop {key}, which never started"
                    live.stop_token = token
                    done.append(f"stop {live}")
                case SendReport():
                    pass  # the heartbeat rules deliver the agent's current report when they choose
        return done

    def held_twice(self) -> list[str]:
        """GPUs held by two processes at once on one node (a shard holds its GPUs from its
        engine's launch until its stop completes; a sidecar holds none)."""
        problems: list[str] = []
        for node in self.up_nodes():
            holder: dict[int, Proc] = {}
            for proc in node.procs:
                if proc.stage is Stage.SIDECAR:
                    continue
                for g in proc.spec.gpus:
                    other = holder.get(g)
                    if other is not None:
                        problems.append(f"GPU {g} of {node.name} held by {other} and {proc}")
                    holder[g] = proc
        return problems
