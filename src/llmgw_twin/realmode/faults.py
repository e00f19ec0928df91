"""Faults injected for real, at their instant, on the processes of a real run (`runner.py`).

Each fault of the scenario format is done to real processes as the twin models it
(docs/real-mode.md says how each is made); the operator's actions go through the admin API,
retried while the controller is down, as an operator's client would.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import replace
from fractions import Fraction
from typing import assert_never

import httpx

from llmgw_twin.control.model import Deployment, ModelName, NodeId, TraceEvent
from llmgw_twin.realmode.cluster import RealCluster
from llmgw_twin.realmode.controllers import RealControllers
from llmgw_twin.realmode.late import node_lateness
from llmgw_twin.realmode.links import LinkFaults
from llmgw_twin.realmode.pace import node_paces
from llmgw_twin.realmode.procs import children_groups
from llmgw_twin.service.common.wire import DeploymentW
from llmgw_twin.twin.report.text import describe
from llmgw_twin.twin.scenario.model import (
    AddNode,
    ClockSkew,
    Cordon,
    CrashNode,
    CutFabricLink,
    DelayHeartbeats,
    DeleteDeployment,
    FabricDown,
    FailGpu,
    Fault,
    HangEngine,
    KillController,
    KillEngine,
    KillNode,
    Partition,
    PartitionController,
    RestartAgent,
    RestartController,
    RestartNode,
    Scenario,
    SetProfile,
    SetReplicas,
    SlowNode,
    StallController,
    StoreDown,
)
from llmgw_twin.twin.scenario.topo_actions import (
    LeafDown,
    NvlinkDegraded,
    NvlinkDomainDown,
    SpineDown,
)
from llmgw_twin.twin.world.faults import fault_subjects
from llmgw_twin.units import fmt_offset

POLL_S = 0.1
"""How often an operator's call that did not land is tried again."""
BOOT_LEAD_S = 3.0
"""How long before a `restart_node` its agent process is started (`boot_ahead`)."""


class RealFaults:
    """The faults of one real run: injected at their instant, undone (a partition healed, a
    controller restarted) on timers of their own."""

    def __init__(
        self,
        cluster: RealCluster,
        scenario: Scenario,
        now_ms: Callable[[], int],
        progress: Callable[[str], None],
    ) -> None:
        self.cluster = cluster
        self.scenario = scenario
        self.now_ms = now_ms
        self.progress = progress
        self.injected: list[TraceEvent] = []
        self._deployments = {d.model: d for d in scenario.deployments}
        self._cuts: dict[NodeId, int] = {}
        self._pending: list[asyncio.TimerHandle] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._booted: set[int] = set()
        """The `restart_node` faults whose agent `boot_ahead` starts."""
        self._links = LinkFaults(
            cluster,
            scenario,
            progress,
            lambda n: bool(self._cuts.get(n)),
            self._cut,
            self._tasks,
            self._pending,
        )
        self._paces = node_paces(cluster.workdir / "nodes", self._pending)
        self._late = node_lateness(cluster.workdir / "nodes", self._pending)

    def boot_ahead(self, t0: float) -> None:
        """Start ahead the processes that a fault brings up, each serving from its instant:
        the agent of each `restart_node` of a node that is down, up to `BOOT_LEAD_S` before
        the fault (never before the node went down), serving from the fault's instant
        (`agent --not-before`), and the next controller of each `restart_controller`, up to
        `BOOT_LEAD_S` before it (after the restart before), serving once its outage is
        over. A machine's boot is the twin's instant, and a Python process's start-up, ten
        times as long on the scaled clock and longer still when the cores are busy, is not part
        of it. `t0`: the run's zero on the host's monotonic clock (the event loop's clock too)."""
        loop = asyncio.get_running_loop()
        down_at: dict[NodeId, int] = {}
        controller_since = 0
        lead_max = int(BOOT_LEAD_S * 1000)
        for fault in self.scenario.faults:  # in time order
            match fault.action:
                case KillNode(node=node) | CrashNode(node=node):
                    down_at[node] = fault.at_ms
                case RestartNode(node=node) if node in down_at:
                    lead_ms = min(lead_max, fault.at_ms - down_at.pop(node))
                    serve_ns = int(t0 * 1e9) + fault.at_ms * 1_000_000
                    start_at = t0 + (fault.at_ms - lead_ms) / 1000
                    self._booted.add(id(fault))
                    self._pending.append(loop.call_at(start_at, self._boot, node, serve_ns))
                case RestartController() if self.scenario.controllers > 1:
                    pass  # one of several: started again at its instant (`controllers.py`)
                case RestartController(down_for_ms=down_for_ms):
                    # strictly after the restart before, so standbys start in restart order
                    lead_ms = max(0, min(lead_max, fault.at_ms - controller_since - 1))
                    controller_since = fault.at_ms
                    serve_ns = int(t0 * 1e9) + (fault.at_ms + down_for_ms) * 1_000_000
                    start_at = t0 + (fault.at_ms - lead_ms) / 1000
                    self._pending.append(loop.call_at(start_at, self._standby, serve_ns))
                case AddNode(info=info):
                    # its agent loads ahead and registers from the fault's instant
                    lead_ms = min(lead_max, fault.at_ms)
                    serve_ns = int(t0 * 1e9) + fault.at_ms * 1_000_000
                    start_at = t0 + (fault.at_ms - lead_ms) / 1000
                    self._booted.add(id(fault))
                    self._pending.append(loop.call_at(start_at, self._boot, info.node, serve_ns))
                case (
                    RestartNode()
                    | Partition()
                    | KillEngine()
                    | HangEngine()
                    | RestartAgent()
                    | FailGpu()
                    | FabricDown()
                    | SetReplicas()
                    | SetProfile()
                    | Cordon()
                    | DeleteDeployment()
                    | KillController()
                    | StallController()
                    | PartitionController()
                    | StoreDown()
                    | ClockSkew()
                    | CutFabricLink()
                    | SlowNode()
                    | DelayHeartbeats()
                    | NvlinkDomainDown()
                    | LeafDown()
                    | SpineDown()
                    | NvlinkDegraded()
                ):
                    pass  # nothing started ahead for these (a controller's own: refused)
                case _:
                    assert_never(fault.action)

    @property
    def _several(self) -> RealControllers | None:
        """The controllers of a scenario with several (`controllers.py`)."""
        return self.cluster.multi if self.scenario.controllers > 1 else None

    def _add_node(self, fault: Fault, node: NodeId) -> None:
        """A node is added: its agent starts now, unless `boot_ahead` started it already (then
        it registers from now on its own)."""
        if id(fault) not in self._booted:
            self.cluster.start_agent(node)

    def _standby(self, serve_ns: int) -> None:
        config = self.cluster.workdir / "controller.yaml"
        self.cluster.start_controller(config, not_before_ns=serve_ns, standby=True)

    def _boot(self, node: NodeId, serve_ns: int) -> None:
        self.cluster.start_agent(node, not_before_ns=serve_ns)

    def cancel(self) -> None:
        """The run is over: what was still to come of its faults does not happen."""
        for handle in self._pending:
            handle.cancel()
        for task in list(self._tasks):
            task.cancel()

    async def inject(self, fault: Fault, client: httpx.AsyncClient) -> None:
        cluster = self.cluster
        event = TraceEvent.of(
            self.now_ms(), "fault.injected", fault=fault.id, **fault_subjects(fault)
        )
        self.injected.append(event)
        self.progress(f"{fmt_offset(event.t_ms)} {event.kind} {describe(event)}")
        match fault.action:
            case KillNode(node=node):
                await asyncio.to_thread(cluster.kill_node, node)
            case CrashNode() | NvlinkDomainDown():
                await asyncio.to_thread(self._crash, fault.action)
            case RestartNode(node=node):
                if id(fault) in self._booted:
                    return  # its agent process was started ahead and serves from now
                if cluster.nodes[node].proc is not None:
                    await asyncio.to_thread(cluster.kill_node, node)
                cluster.start_agent(node)
            case Partition(nodes=nodes, for_ms=for_ms):
                self._cut(nodes, for_ms)
            case KillEngine(node=node, replica_of=model):
                await asyncio.to_thread(self._kill_engine, node, model)
            case (
                RestartController()
                | KillController()
                | StallController()
                | PartitionController()
                | StoreDown()
            ) if self._several:
                await self._several.inject(fault.action)
            case RestartController(down_for_ms=down_for_ms):
                await self._restart_controller(down_for_ms)
            case SetReplicas(model=model, replicas=replicas):
                self._put_deployment(client, model, "set_replicas", replicas=replicas)
            case SetProfile(model=model, profile=profile):
                self._put_deployment(client, model, "set_profile", profile=profile)
            case Cordon() | DeleteDeployment():
                task = asyncio.create_task(self._operate(client, fault.action))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            case FailGpu(node=node, gpu=gpu):
                # the hardware's part; the node's agent sees it, reports it and kills the engine
                cluster.fail_gpu(node, gpu)
            case FabricDown() | CutFabricLink() | LeafDown() | SpineDown():
                self._links.inject(client, fault.action)
            case RestartAgent(node=node, down_for_ms=down_for_ms):
                await asyncio.to_thread(self._kill_agent, node)
                # loaded now, serving from the end of the outage (as a controller restart)
                cluster.start_agent(node, not_before_ns=time.monotonic_ns() + down_for_ms * 10**6)
            case HangEngine(node=node, replica_of=model):
                await asyncio.to_thread(self._hang_engine, node, model)
            case AddNode(info=info):
                self._add_node(fault, info.node)
            case (
                SlowNode(node=node, factor_num=num, factor_den=den, for_ms=for_ms)
                | NvlinkDegraded(node=node, factor_num=num, factor_den=den, for_ms=for_ms)
            ):
                self._paces.during(node, Fraction(num, den), for_ms)
            case DelayHeartbeats(nodes=nodes, by_ms=by_ms, for_ms=for_ms):
                for late in nodes:
                    self._late.during(late, by_ms, for_ms)
            case (
                KillController() | StallController() | PartitionController() | StoreDown()
            ) | ClockSkew():
                raise AssertionError("refused up front (check_real_supported)")
            case _:
                assert_never(fault.action)

    def _crash(self, action: CrashNode | NvlinkDomainDown) -> None:
        """A node crashes, or every node of an NVLink domain at one instant."""
        nodes = (action.node,) if isinstance(action, CrashNode) else action.nodes
        for node in nodes:
            self.cluster.crash_node(node)

    async def _restart_controller(self, down_for_ms: int) -> None:
        """Kill the controller; the next one was started ahead (`boot_ahead`) and has loaded its
        code, and opens the store and serves once the outage is over: a Python process's
        seconds of start-up, ten times as long on the scaled clock, are not downtime the
        scenario asked for (later faults keep their own instants)."""
        cluster = self.cluster
        await asyncio.to_thread(cluster.kill_controller)
        if not cluster.promote_standby():  # it died: one now, loading during the outage
            serve_at = time.monotonic_ns() + down_for_ms * 1_000_000
            cluster.start_controller(cluster.workdir / "controller.yaml", not_before_ns=serve_at)

    def _put_deployment(
        self, client: httpx.AsyncClient, model: ModelName, what: str, **change: object
    ) -> None:
        """`set_replicas` and `set_profile`: the deployment as the operator now wants it (the
        faults before, in order, applied to the file's), sent whole in one PUT."""
        dep = self._deployments[model] = replace(self._deployments[model], **change)  # type: ignore[arg-type]
        call = self._set_replicas(client, dep, what)
        task = asyncio.create_task(call)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _set_replicas(
        self,
        client: httpx.AsyncClient,
        dep: Deployment,
        what: str = "set_replicas",
    ) -> None:
        """The operator's PUT of the deployment (`set_replicas`, `set_profile`); its client
        retries while the API is down, until the run ends."""
        while self.now_ms() < self.scenario.duration_ms:
            # to whichever controller leads now (of several, `controllers.py`)
            url = f"{self.cluster.controller_url}/v1/admin/deployments/{dep.model}"
            body = DeploymentW.from_core(dep).model_dump(mode="json")
            with contextlib.suppress(httpx.HTTPError):
                r = await client.put(url, json=body)
                if r.status_code == 200:
                    return
            await asyncio.sleep(POLL_S)
        self.progress(
            f"{what} {dep.model} ({dep.profile} x {dep.replicas}) never reached the controller"
        )

    async def _operate(self, client: httpx.AsyncClient, action: Cordon | DeleteDeployment) -> None:
        """An operator action through the admin API, retried while the API is down (at
        whichever controller leads at each try)."""
        while self.now_ms() < self.scenario.duration_ms:
            method, url = self._call_of(action)
            with contextlib.suppress(httpx.HTTPError):
                r = await client.request(method, url)
                if r.status_code == 200:
                    return
            await asyncio.sleep(POLL_S)
        self.progress(f"{method} {url} never reached the controller")

    def _call_of(self, action: Cordon | DeleteDeployment) -> tuple[str, str]:
        base = self.cluster.controller_url
        match action:
            case Cordon(node=node, op="uncordon"):
                method, url = "DELETE", f"{base}/v1/admin/nodes/{node}/cordon"
            case Cordon(node=node, op=op):
                method, url = "POST", f"{base}/v1/admin/nodes/{node}/{op}"
            case DeleteDeployment(model=model):
                method, url = "DELETE", f"{base}/v1/admin/deployments/{model}"
            case _:
                assert_never(action)
        return method, url

    def _kill_agent(self, node: NodeId) -> None:
        """SIGKILL to the node's agent process alone: its shards run on, for the agent started
        after it to adopt (their process groups are remembered first, so the run still ends
        them if none does)."""
        n = self.cluster.nodes[node]
        if n.proc is None:
            return
        self.cluster.remember_groups(node)
        self.cluster.started_groups |= children_groups(n.proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(n.proc.pid, signal.SIGKILL)
        n.proc.wait(timeout=10)
        n.proc = None

    def _cut(self, nodes: tuple[NodeId, ...], for_ms: int) -> None:
        for node in nodes:
            self._cuts[node] = self._cuts.get(node, 0) + 1
            self.cluster.nodes[node].cut()
        asyncio.get_running_loop().call_later(for_ms / 1000, self._heal, nodes)

    def _heal(self, nodes: tuple[NodeId, ...]) -> None:
        for node in nodes:  # overlapping partitions: the link heals with the last
            self._cuts[node] -= 1
            if self._cuts[node] == 0:
                self.cluster.nodes[node].heal()

    def _engines(self, node: NodeId, model: ModelName) -> list[tuple[str, int, int]]:
        """(replica, rank, engine pid) of the model's running engines on the node, in the
        twin's order (by replica id, rank)."""
        state = self.cluster.agent_state(node) or {}
        out = []
        for shard in sorted(state.get("shards", []), key=lambda s: (s["replica"], s["rank"])):
            pid = shard.get("engine_pid")
            replica = str(shard.get("replica", ""))
            alive = shard.get("phase") not in ("exited", "waiting")
            if replica.rsplit("-r", 1)[0] == model and alive and isinstance(pid, int):
                out.append((replica, int(shard["rank"]), pid))
        return out

    def _kill_engine(self, node: NodeId, model: ModelName) -> None:
        for _, _, pid in self._engines(node, model)[:1]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _hang_engine(self, node: NodeId, model: ModelName) -> None:
        """The first engine not hung already stops (SIGSTOP: alive, port open, silent). A hung
        worker stalls its replica's collective in the twin, so its leader stops answering too;
        the sim engine's leader waits on no collective, so its group is stopped as well."""
        for replica, rank, pid in self._engines(node, model):
            if pid in self.cluster.hung:
                continue
            self.cluster.hang(pid)
            if rank > 0:
                for other in sorted(self.cluster.nodes):
                    for r, k, leader in self._engines(other, model):
                        if r == replica and k == 0 and leader not in self.cluster.hung:
                            self.cluster.hang(leader)
            return
