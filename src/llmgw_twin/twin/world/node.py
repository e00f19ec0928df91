"""A simulated node: its agent (the real agent core in this shell), its sidecars, and its
sim-engine shards (`SimEngine`, the sim engine's model), in virtual time.

It boots (registers, then heartbeats at a phase drawn from the run's seeded random source; its
inventory finds the GPUs that failed before and the state of its fabric links), turns the agent
core's commands into simulated processes, and dies with everything on it when killed (power off)
or crashed (its processes die and their sockets close, so peers on other nodes notice at once).
Its agent alone may die and come back (`restart_agent`): the shards run on, and the new agent
adopts them. The leader binds its rendezvous point and serves `load_time` after start once every
worker has joined; a worker joins its leader over the fabric and serves nothing. A hung engine
stays alive and answers nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, assert_never

import simpy

from llmgw_twin.control.agent import AgentCore, LocalShard
from llmgw_twin.control.model import NodeId, NodeInfo, ShardKey, ShardSpec
from llmgw_twin.control.protocol import (
    AgentEvent,
    Assigned,
    EngineExited,
    EngineJoined,
    EngineServing,
    EngineStarted,
    FabricLink,
    GpuFailed,
    ReportRequested,
    SendReport,
    ShardStopped,
    SidecarUp,
    StartEngine,
    StartSidecar,
    StopShard,
)
from llmgw_twin.engines.base import DEFAULT_HTTP_PORT, LaunchContext
from llmgw_twin.engines.registry import adapter_for
from llmgw_twin.twin.world.adopt import adopted

if TYPE_CHECKING:
    from llmgw_twin.twin.world.sim import World

SIDECAR_START_MS = 100
"""Time from starting a shard's sidecar to it being up."""
PEER_LOST_EXIT_CODE = 1
"""What an engine exits with when a GPU under it fails, its replica's fabric goes down, or a
peer's process on another node dies (its connection closes)."""
JOIN_RETRY_MS = 1_000
"""How often a worker that cannot reach its leader's rendezvous point tries again."""


def http_port_for(spec: ShardSpec) -> int:
    """The twin's agent serves a leader on 8000 + its first GPU: unique on the node."""
    return DEFAULT_HTTP_PORT + spec.gpus[0]


@dataclass(slots=True)
class SimEngine:
    """One engine process of one shard."""

    node: SimNode
    spec: ShardSpec
    argv: tuple[str, ...]
    started_ms: int
    stopped: bool = False
    loaded: bool = False
    joined: set[int] = field(default_factory=set)  # leader: worker ranks that joined
    has_joined: bool = False  # worker: joined its leader
    serving: bool = False  # leader: told its agent it serves
    hung: bool = False  # alive, port open, answers nothing and makes no progress
    key: ShardKey = field(init=False)

    def __post_init__(self) -> None:
        self.key = self.spec.key  # asked for at every turn of the world


class SimNode:
    """A node: power, its agent (core plus this shell), and the engines it runs."""

    def __init__(self, world: World, info: NodeInfo) -> None:
        self.world = world
        self.info = info
        self.up = False
        self.generation = 0  # bumped at every boot and kill: late callbacks check it
        self.agent_up = False
        """The agent process runs (it may die alone, its shards running on: `agent_dies`)."""
        self.agent_epoch = 0  # bumped when the agent alone dies: its own late callbacks check it
        self.core = AgentCore(info)
        self.engines: dict[ShardKey, SimEngine] = {}
        self.next_beat: simpy.Event | None = None
        """The agent's pending heartbeat timer (None while dead or coasting)."""
        self.next_beat_at = 0
        self.slow: list[Fraction] = []
        """The slowdowns under way (`slow_node`): its engines run the slowest's times slower."""

    def slowed(self, ms: int) -> int:
        """`ms` of an engine's work here, at the node's pace now (rounded up)."""
        if not self.slow:
            return ms
        factor = max(self.slow)
        return -(-ms * factor.numerator // factor.denominator)

    @property
    def name(self) -> NodeId:
        return self.info.node

    def engines_sorted(self) -> list[SimEngine]:
        return [self.engines[k] for k in sorted(self.engines)]

    def boot(self) -> None:
        """Power on empty: a fresh agent registers, then heartbeats at a seeded phase. Its
        inventory finds the node's failed GPUs failed still (hardware does not heal by a
        reboot) and its fabric links as they are."""
        if self.up:
            self.kill()
        self.up = True
        self.generation += 1
        self._agent_start(())

    def boot_running(self, engines: list[SimEngine]) -> None:
        """Power on with `engines` already running (a scenario's `initial` state,
        `world/initial.py`): the agent finds them, as a restarted agent does, and registers
        with them."""
        self.up = True
        self.generation += 1
        for engine in engines:
            self.engines[engine.key] = engine
            self.world.hold_gpus(engine)
        self._agent_start(adopted(self.engines_sorted(), self._endpoint))

    def resume_start(self, engine: SimEngine) -> None:
        """An engine found starting (`boot_running`) loads from the run's start, and a worker
        joins its leader."""
        self.world.later(self.slowed(engine.spec.load_time_ms), lambda: self._loaded(engine))
        if engine.spec.rank > 0:
            self._try_join(engine)

    def _agent_start(self, shards: tuple[LocalShard, ...]) -> None:
        """An agent process starts with `shards` (adopted) and registers, then heartbeats at a
        seeded phase; a new incarnation every time."""
        self.agent_up = True
        failed = tuple(sorted(g for n, g in self.world.failed_gpus if n == self.name))
        self.core = AgentCore(
            self.info,
            incarnation=max(self.generation, self.core.incarnation + 1),
            shards=shards,
            failed_gpus=failed,
            fabric_up=self.world.network.fabric_link_up(self.name),
            heartbeat_interval_ms=self.world.timings.heartbeat_interval_ms,
        )
        self.world.send_to_controller(self.name, self.core.registration())
        interval = self.world.timings.heartbeat_interval_ms
        phase = self.world.rng.randrange(1, interval + 1)
        self.world.heartbeats.start(self, phase)

    def agent_dies(self) -> None:
        """The agent process alone dies (SIGKILL, a crash): no more heartbeats or reports, and
        what was sent to it is lost; its shards run on, and serve, unwatched."""
        if not self.up or not self.agent_up:
            return
        self.world.heartbeats.land(self.name)
        self.next_beat = None
        self.agent_up = False
        self.agent_epoch += 1

    def agent_starts(self) -> None:
        """A new agent process finds the shards its predecessor left (`adopted`) and registers
        with them; a shard whose engine is gone is not among them."""
        if self.up and not self.agent_up:
            self._agent_start(adopted(self.engines_sorted(), self._endpoint))

    def restart_agent(self, down_for_ms: int) -> None:
        """The agent dies and a new one starts `down_for_ms` later (unless the node went off)."""
        self.agent_dies()
        generation = self.generation

        def back() -> None:
            if generation == self.generation:  # the node was not powered off meanwhile
                self.agent_starts()

        self.world.later(down_for_ms, back)

    def _endpoint(self, spec: ShardSpec) -> str:
        return f"http://{self.name}:{http_port_for(spec)}"

    def kill(self, sockets_close: bool = False) -> None:
        """Power off: the agent and every engine on the node are gone at once. Peers elsewhere
        notice nothing yet: their connections to this node just go silent (unless
        `sockets_close`: the node crashed and its kernel closed them)."""
        self.world.heartbeats.land(self.name)
        self.next_beat = None
        self.up = False
        self.agent_up = False
        self.generation += 1
        for engine in self.engines_sorted():
            self._stop_engine(engine, sockets_close)
        self.engines.clear()

    def crash(self) -> None:
        """The node's processes die at once and the kernel closes their sockets: gone as by
        `kill`, and every engine elsewhere of a multi-node replica with a process here sees its
        peer's connection close and exits."""
        replicas = {e.spec.replica for e in self.engines.values() if e.spec.shard_count > 1}
        self.kill(sockets_close=True)
        self.world.peers_lost(replicas, self.name)

    def fabric_link(self, up: bool) -> None:
        """The node's fabric links went down or came back: its inventory sees the port state."""
        self.deliver(FabricLink(up), self.generation)

    def deliver(self, event: AgentEvent, generation: int, epoch: int | None = None) -> None:
        if not (self.up and self.agent_up) or generation != self.generation:
            return  # sent to an agent that has since died
        if epoch is not None and epoch != self.agent_epoch:
            return  # one of a dead agent's own timers
        self.world.heartbeats.land(self.name)  # its heartbeats so far, before anything changes
        step = self.core.handle(event)
        if isinstance(event, Assigned | ReportRequested) and self.world.on_command is not None:
            refused = step.refused is not None
            self.world.on_command(self.name, self.core.incarnation, event.epoch, refused)
        for cmd in step.commands:
            match cmd:
                case StartSidecar(spec=spec):
                    self._start_sidecar(spec)
                case StartEngine(spec=spec):
                    self._start_engine(spec)
                case StopShard(key=key, token=token):
                    engine = self.engines.pop(key, None)
                    if engine is not None:
                        self._stop_engine(engine)  # SIGKILL: gone at once
                    self._stopped_soon(key, token)
                case SendReport(report=report):
                    self.world.send_to_controller(self.name, report)  # at once, not a heartbeat
                case _:
                    assert_never(cmd)

    def _stopped_soon(self, key: ShardKey, token: int) -> None:
        """Tell the agent the shard's processes are gone, once this step is carried out."""
        generation, epoch = self.generation, self.agent_epoch
        self.world.later(0, lambda: self.deliver(ShardStopped(key, token), generation, epoch))

    def _start_sidecar(self, spec: ShardSpec) -> None:
        generation, epoch = self.generation, self.agent_epoch
        self.world.later(
            SIDECAR_START_MS, lambda: self.deliver(SidecarUp(spec.key), generation, epoch)
        )

    def _start_engine(self, spec: ShardSpec) -> None:
        ctx = LaunchContext(leader_host=spec.leader, http_port=http_port_for(spec))
        launch = adapter_for(spec.engine).launch(spec, ctx)
        engine = SimEngine(self, spec, launch.argv, self.world.now)
        self.engines[spec.key] = engine
        self.world.hold_gpus(engine)
        self.world.engine_starts += 1
        self.world.engine_start_times.append(self.world.now)
        self.deliver(EngineStarted(spec.key, launch.argv), self.generation)
        if any((self.name, g) in self.world.failed_gpus for g in spec.gpus):
            self.kill_engine(spec.key, PEER_LOST_EXIT_CODE)  # a failed GPU: it dies at once
            return
        self.world.later(self.slowed(spec.load_time_ms), lambda: self._loaded(engine))
        if spec.rank == 0:
            for worker in self.world.waiting.pop(spec.replica, []):
                worker.node._try_join(worker)
        else:
            self._try_join(engine)

    def _stop_engine(self, engine: SimEngine, sockets_close: bool = True) -> None:
        engine.stopped = True
        self.world.free_gpus(engine)
        if self.world.on_engine_stopped is not None:
            self.world.on_engine_stopped(engine, sockets_close)

    def _notify(self, engine: SimEngine, event: AgentEvent) -> None:
        if not engine.stopped and not engine.hung:
            self.deliver(event, self.generation)

    def _loaded(self, engine: SimEngine) -> None:
        if engine.stopped or engine.hung:
            return
        engine.loaded = True
        self._maybe_up(engine)

    def _maybe_up(self, engine: SimEngine) -> None:
        spec = engine.spec
        if spec.rank == 0:
            if engine.hung or engine.serving:
                return
            if engine.loaded and len(engine.joined) == spec.shard_count - 1:
                endpoint = self._endpoint(spec)
                engine.serving = not engine.stopped
                self._notify(engine, EngineServing(spec.key, endpoint))
        elif engine.loaded and engine.has_joined:
            self._notify(engine, EngineJoined(spec.key))

    def _try_join(self, engine: SimEngine) -> None:
        """A worker connects to its leader's rendezvous point over the fabric."""
        if engine.stopped or engine.has_joined or engine.hung:
            return
        spec = engine.spec
        leader_node = self.world.nodes[spec.leader]
        leader = leader_node.engines.get(ShardKey(spec.replica, 0))
        if leader is None or leader.stopped:
            self.world.waiting.setdefault(spec.replica, []).append(engine)  # until it binds
            return
        latency = self.world.network.fabric_latency_ms(self.name, spec.leader)
        if latency is None:  # no fabric path to the leader: try again later
            self.world.later(JOIN_RETRY_MS, lambda: self._try_join(engine))
            return

        def arrive() -> None:
            if engine.hung or leader.hung:
                return  # connected, but no handshake ever completes
            if engine.stopped or leader.stopped:
                self._try_join(engine)
                return
            engine.has_joined = True
            leader.joined.add(spec.rank)
            leader_node._maybe_up(leader)
            self._maybe_up(engine)

        self.world.later(latency, arrive)

    def fail_gpu(self, gpu: int) -> None:
        """A GPU fails: the engine on it dies, and the agent's inventory notices the GPU."""
        self.world.failed_gpus.add((self.name, gpu))
        for engine in self.engines_sorted():
            if gpu in engine.spec.gpus and not engine.hung:  # a hung one notices nothing
                self.kill_engine(engine.key, PEER_LOST_EXIT_CODE)
        self.deliver(GpuFailed(gpu), self.generation)

    def lose_peers(self) -> None:
        """The node's fabric went down: every multi-node engine here loses its peers and exits
        (a hung one notices nothing)."""
        for engine in self.engines_sorted():
            if engine.spec.shard_count > 1 and not engine.hung:
                self.kill_engine(engine.key, PEER_LOST_EXIT_CODE)

    def hang_engine(self, key: ShardKey) -> None:
        """The engine stays alive with its port open and answers nothing from now on."""
        engine = self.engines.get(key)
        if engine is not None and not engine.hung:
            self.world.hang(engine)

    def kill_engine(self, key: ShardKey, exit_code: int) -> None:
        """The engine process dies on its own; the agent notices and reports the exit."""
        engine = self.engines.pop(key, None)
        if engine is None:
            return
        self._stop_engine(engine)
        self.deliver(EngineExited(key, exit_code), self.generation)
