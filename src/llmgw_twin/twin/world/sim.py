"""The simulated world: the clock (SimPy), the network, the nodes (`node.SimNode`), and ground
truth for the checkers: which engine holds which GPU.

A hung engine stays alive and answers nothing; so does its leader, whose collective stalls. The
agent shell probes its serving leaders every `probe_interval`; the model costs no periodic event
per engine: a hang schedules one probe, one interval later, at the leader's node.

`World` owns the clock (SimPy), the network, the nodes, and ground truth for the checkers: which
engine holds which GPU.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import simpy

from llmgw_twin.control.model import NodeId, NodeInfo, ReplicaId, ShardKey, Timings
from llmgw_twin.control.protocol import (
    AgentEvent,
    Assigned,
    ControllerEvent,
    EngineUnresponsive,
    Heartbeat,
)
from llmgw_twin.twin.world.heartbeats import Heartbeats
from llmgw_twin.twin.world.network import Network
from llmgw_twin.twin.world.node import PEER_LOST_EXIT_CODE, SimEngine, SimNode

M = TypeVar("M", Heartbeat, Assigned)


@dataclass(slots=True)
class _InFlight(Generic[M]):
    """A node's last message of one kind, sent and not yet delivered (`World._send_latest`)."""

    msg: M
    match: tuple[int, ...]
    """What a newer one must share to take its place: the instant it was sent and the path's
    latency (an assignment: also the agent process and the leader's epoch)."""


class World:
    def __init__(
        self,
        env: simpy.Environment,
        nodes: tuple[NodeInfo, ...],
        network: Network,
        timings: Timings,
        rng: random.Random,
        to_controller: Callable[[ControllerEvent], None],
        bulk: bool = True,
    ) -> None:
        self.env = env
        self.network = network
        self.timings = timings
        self.rng = rng
        self._to_controller = to_controller
        self.nodes: dict[NodeId, SimNode] = {n.node: SimNode(self, n) for n in nodes}
        self.gpu_holder: dict[tuple[NodeId, int], ShardKey] = {}
        self.gpu_violations: list[str] = []
        self.waiting: dict[ReplicaId, list[SimEngine]] = {}
        """Workers started before their leader bound its rendezvous point."""
        self.failed_gpus: set[tuple[NodeId, int]] = set()
        self.engine_starts = 0
        self.engine_start_times: list[int] = []
        self.heartbeats = Heartbeats(self, bulk)
        self._outgoing: dict[NodeId, _InFlight[Heartbeat]] = {}
        """Each node's last heartbeat sent and not yet delivered (`send_to_controller`)."""
        self._to_agent: dict[NodeId, _InFlight[Assigned]] = {}
        """Each node's last assignment sent and not yet delivered (`send_to_agent`)."""
        self.on_command: Callable[[NodeId, int, int, bool], None] | None = None
        """Told of every controller command an agent process (node, incarnation) acted on or
        refused (False, True), with the command's epoch."""
        self.on_engine_stopped: Callable[[SimEngine, bool], None] | None = None
        """Told of every engine that stops, and whether its connections closed (its process
        died on a running node, or its node crashed) rather than went silent (power off)."""

    @property
    def now(self) -> int:
        return int(self.env.now)

    def later(self, delay_ms: int, fn: Callable[[], None]) -> None:
        """Run `fn` after `delay_ms` of virtual time (a bare timeout: no process per message)."""
        ev = self.env.timeout(delay_ms)
        ev.callbacks.append(lambda _ev: fn())

    def on_timeout(self, delay_ms: int, callback: Callable[[simpy.Event], None]) -> None:
        """`later` for a callback that takes the timeout's event (one call fewer a timer)."""
        self.env.timeout(delay_ms).callbacks.append(callback)

    def send_to_controller(self, node: NodeId, msg: ControllerEvent) -> None:
        """An agent's message, delivered after the node's control latency. As the agent's own
        report queue does (`service/agent/reports.py`), a heartbeat sent while the node's last
        message is a heartbeat of this very instant, not yet delivered, takes its place: each is
        the node's whole shard set, and the newer says it all (two shards starting at once are
        one report, not two)."""
        latency = self.network.control_latency_ms(node)
        if latency is None:
            return
        if isinstance(msg, Heartbeat):
            self._send_latest(
                self._outgoing, node, msg, (self.now, latency), latency, self._to_controller
            )
            return
        self._outgoing.pop(node, None)  # a heartbeat after this one follows it, as sent
        self.later(latency, lambda: self._to_controller(msg))

    def send_to_agent(self, node: NodeId, msg: AgentEvent) -> None:
        """A controller's command, delivered after the node's control latency. As the
        controller's delivery does (`service/controller/delivery.py`), an assignment decided in
        the same millisecond as the node's last one from the same leader, not yet delivered,
        takes its place (each is the node's whole set: a placement cut into slices tells a node
        once what it decided for it in several)."""
        latency = self.network.control_latency_ms(node)
        if latency is None:
            return
        target = self.nodes[node]
        generation = target.generation
        if isinstance(msg, Assigned):

            def deliver(latest: Assigned) -> None:
                target.deliver(latest, generation)

            match = (self.now, latency, generation, msg.epoch)  # the same leader, to the same agent
            self._send_latest(self._to_agent, node, msg, match, latency, deliver)
            return
        self._to_agent.pop(node, None)  # an assignment after this one follows it, as sent
        self.later(latency, lambda: target.deliver(msg, generation))

    def _send_latest(
        self,
        pending: dict[NodeId, _InFlight[M]],
        node: NodeId,
        msg: M,
        match: tuple[int, ...],
        latency: int,
        deliver: Callable[[M], None],
    ) -> None:
        """Send `msg`, the node's whole set of its kind, unless the node's last one of that
        kind, still on its way, was sent with the same `match`: then it takes that one's place."""
        last = pending.get(node)
        if last is not None and last.match == match:
            last.msg = msg
            return
        out = _InFlight(msg, match)
        pending[node] = out

        def arrive() -> None:
            if pending.get(node) is out:
                del pending[node]
            deliver(out.msg)

        self.later(latency, arrive)

    def engines(self) -> list[SimEngine]:
        return [e for n in self.nodes.values() for e in n.engines_sorted()]

    def engine(self, node: NodeId, key: ShardKey) -> SimEngine | None:
        return self.nodes[node].engines.get(key)

    def leader_of(self, engine: SimEngine) -> SimEngine | None:
        """The running leader (rank 0) of `engine`'s replica, on the leader's node."""
        if engine.spec.rank == 0:
            return engine
        leader = self.nodes[engine.spec.leader].engines.get(ShardKey(engine.spec.replica, 0))
        return None if leader is None or leader.stopped else leader

    # --- process faults ------------------------------------------------------------------------

    def hang(self, engine: SimEngine) -> None:
        """`engine` stops answering and making progress, and so does its leader (a hung worker
        stalls the replica's collective); the worker's agent and the leader's notice at their
        next probe (the worker's first: each probes on its own node)."""
        engine.hung = True
        if engine.spec.rank > 0:
            self._probe_worker(engine)
        leader = self.leader_of(engine)
        if leader is None:
            return  # a worker whose leader is not running yet: the leader will never serve
        leader.hung = True
        leader_node = leader.node
        generation = leader_node.generation

        def probe() -> None:
            if (
                leader_node.up
                and leader_node.generation == generation
                and leader_node.engines.get(leader.key) is leader
                and not leader.stopped
                and leader.serving
            ):
                leader_node.deliver(EngineUnresponsive(leader.key), generation)

        self.later(self.timings.probe_interval_ms, probe)

    def _probe_worker(self, engine: SimEngine) -> None:
        """A joined worker's agent finds it silent at its next probe."""
        node = engine.node
        generation = node.generation

        def probe() -> None:
            if (
                node.up
                and node.generation == generation
                and node.engines.get(engine.key) is engine
                and not engine.stopped
                and engine.has_joined
                and engine.loaded
            ):
                node.deliver(EngineUnresponsive(engine.key), generation)

        self.later(self.timings.probe_interval_ms, probe)

    def peers_lost(self, replicas: set[ReplicaId], crashed: NodeId) -> None:
        """The processes of `replicas` on `crashed` died and their sockets closed: every engine
        of those replicas on another node exits, having lost its peer (a hung one notices
        nothing)."""
        for name in sorted(self.nodes):
            if name == crashed:
                continue
            node = self.nodes[name]
            for engine in node.engines_sorted():
                if engine.spec.replica in replicas and not engine.hung:
                    node.kill_engine(engine.key, PEER_LOST_EXIT_CODE)

    # --- GPU ground truth --------------------------------------------------------------------

    def hold_gpus(self, engine: SimEngine) -> None:
        for g in engine.spec.gpus:
            slot = (engine.spec.node, g)
            holder = self.gpu_holder.get(slot)
            if holder is not None and holder != engine.key:
                self.heartbeats.land_all()  # reported at the controller's next step, whichever
                self.gpu_violations.append(
                    f"t={self.now}ms GPU {g} of {engine.spec.node} held by "
                    f"{holder.replica}/{holder.rank} and {engine.key.replica}/{engine.key.rank}"
                )
            self.gpu_holder[slot] = engine.key

    def free_gpus(self, engine: SimEngine) -> None:
        for g in engine.spec.gpus:
            slot = (engine.spec.node, g)
            if self.gpu_holder.get(slot) == engine.key:
                del self.gpu_holder[slot]
