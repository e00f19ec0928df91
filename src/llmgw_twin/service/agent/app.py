"""The node agent service: the agent core behind FastAPI, carried out with real processes.

Role: the production twin of the twin's `SimNode`. `AgentRuntime` owns the `AgentCore` (its
`NodeInfo` read from the inventory under the configured root), registers with the controller,
heartbeats, answers the controller's assignments and report requests, and carries out the core's
commands: a shard's sidecar first, polled until it answers; its engine only once the core, told
the sidecar is up, asks for it; stops; reports. `create_agent_app` is the HTTP face.

Readiness, as reported to the core:
- the leader is serving (`EngineServing`, its endpoint `http://{engine_host}:{port}`) once its
  sidecar's `GET /engine` says the engine's health URL answers 200;
- a rank whose adapter says it listens (llama.cpp's RPC worker) has joined once its sidecar says
  its port accepts connections;
- a sim worker, which opens no port, has joined (`EngineJoined`) once its sidecar finds the ready
  file the agent gave it (`--ready-file`): written once it has loaded and joined its leader, so a
  worker slower than its leader holds the replica back, as the twin's does;
- any other rank that opens no port has joined once its process has stayed up for
  `worker_settle`; the leader's health then speaks for the replica, as the sim leader serves only
  when every worker has joined;
- an engine not ready within `ready_timeout_ms` is stopped and reported exited.

Invariants:
- Core calls happen in `_feed`, which never awaits: the core's commands are started in the
  order given, each as a task where it must wait.
- Every process it starts (sidecars, engines) is in its own process group and is stopped as a
  group on `StopShard` and on the agent's shutdown (SIGTERM, SIGINT); nothing is left behind.
  Killed (SIGKILL) or crashed, the agent leaves them running, named in its run-state file, and
  the next agent on the node adopts those whose sidecar and engine both still run and ends the
  rest, before it registers (`ShardRunner.adopt`, `resume`; docs/services.md, "Agent restarts").
- Reports go to the controller one at a time, in the order the core made them (a newer
  heartbeat replaces one not yet sent), so the controller never sees a state go backwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from typing import Annotated, Any, assert_never

import httpx
from fastapi import Depends, FastAPI, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from llmgw_twin.control.agent import AgentCore
from llmgw_twin.control.model import NodeInfo
from llmgw_twin.control.protocol import (
    AgentEvent,
    Assigned,
    Heartbeat,
    HeartbeatDue,
    NodeRegistered,
    ReportRequested,
    SendReport,
    StartEngine,
    StartSidecar,
    StopShard,
)
from llmgw_twin.service.agent.config import AgentSettings
from llmgw_twin.service.agent.late import LateHeartbeats
from llmgw_twin.service.agent.node_info import read_node_info
from llmgw_twin.service.agent.node_watch import NodeWatch, engines_on, poll_interval_ms
from llmgw_twin.service.agent.reports import Reports
from llmgw_twin.service.agent.shards import ShardRunner
from llmgw_twin.service.common.auth import AgentKeys, CredentialFile
from llmgw_twin.service.common.gate import guard
from llmgw_twin.service.common.leaders import Controllers
from llmgw_twin.service.common.replies import CONFLICT, ERRORS
from llmgw_twin.service.common.serving import lifespan_of, not_before_wait_s
from llmgw_twin.service.common.tls import client_verify
from llmgw_twin.service.common.wire import (
    AssignShardsW,
    NodeInfoW,
    Refused,
    RequestReportW,
    install_error_handlers,
)

log = logging.getLogger("llmgw_twin.agent")


class AgentRuntime:
    def __init__(
        self,
        settings: AgentSettings,
        *,
        info: NodeInfo | None = None,
        controller_transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.settings = settings
        self.controllers = Controllers(settings.controller_urls or (settings.controller_url,))
        """Where the controllers listen; the one that answered last first."""
        if not settings.engines:
            log.warning(
                "no engine binaries configured: node %s can run the sim engine and nothing else",
                settings.node,
            )
        for engine, b in settings.engines:
            for path in (b.binary, b.worker_binary):
                if path is not None and not os.access(path, os.X_OK):
                    log.warning("engine %s: %s is not an executable file here", engine, path)
        self.info = info if info is not None else read_node_info(settings)
        self.keys: AgentKeys | None = None
        """None: no credentials (the config names no credential file; loopback only)."""
        if settings.credential is not None:
            self.keys = self._read_credential()
        self.incarnation = time.time_ns() // 1000  # differs at every start of the agent
        self._t0_ns = time.monotonic_ns()
        self.shards = ShardRunner(settings, self._feed, self.now_ms, self.incarnation)
        adopted = self.shards.adopt()  # an earlier agent's shards that still run
        # failed GPUs and links down as the node shows them now: a GPU stays failed across
        # restarts of the agent, as the hardware keeps it failed
        self.watch = NodeWatch(settings.root, settings.use_nvml)
        self.core = AgentCore(
            self.info,
            incarnation=self.incarnation,
            shards=adopted,
            failed_gpus=tuple(sorted(self.watch.failed)),
            fabric_up=self.watch.links_up is not False,
            heartbeat_interval_ms=settings.heartbeat_interval_ms,
        )
        self._controller_transport = controller_transport
        self._client: httpx.AsyncClient | None = None
        self.reports = Reports(
            self.controllers,
            lambda: self._client,
            lambda: self.keys,
            self._reload_credential,
            self._report_asked,
            settings.advertise_url,
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self.serve_from_ns: int | None = None
        """`agent --not-before`: the host's monotonic instant `start` waits for. Everything
        above (config, inventory, credential, adoption) is done by then, so the agent registers
        at that instant, not a Python start-up later."""

    def now_ms(self) -> int:
        return (time.monotonic_ns() - self._t0_ns) // 1_000_000

    def _read_credential(self) -> AgentKeys:
        assert self.settings.credential is not None
        cred = CredentialFile.read(self.settings.credential)
        if cred.node != self.settings.node:
            raise ValueError(
                f"{self.settings.credential}: the credential is node {cred.node}'s, "
                f"and this agent is node {self.settings.node}"
            )
        return AgentKeys(cred.node, cred.token, cred.controller_token)

    def _reload_credential(self) -> None:
        """After a 401: the credential may have been rotated, and the file rewritten."""
        try:
            keys = self._read_credential()
        except ValueError as e:
            log.warning("%s", e)
            return
        if self.keys is None or keys.token != self.keys.token:
            log.info("read a new credential from %s", self.settings.credential)
            self.keys = keys

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        if self.serve_from_ns is not None:
            await asyncio.sleep(not_before_wait_s(self.serve_from_ns))
        self._client = httpx.AsyncClient(
            transport=self._controller_transport,
            timeout=self.settings.report_timeout_ms / 1000,
            limits=httpx.Limits(keepalive_expiry=60.0),
            trust_env=False,
            verify=client_verify(self.settings.controller_tls),
        )
        await self.shards.start()
        await self.shards.resume()  # before registering: what it reports runs, the rest ended
        log.info(
            "node %s: fabric %s, %d GPUs, engines %s; controller %s",
            self.info.node,
            self.info.fabric,
            self.info.gpus,
            ", ".join(self.info.engines),
            self.settings.controller_url,
        )
        self._enqueue(self.core.registration())
        self._tasks = [
            asyncio.create_task(self.reports.send_all()),
            asyncio.create_task(self._heartbeats()),
            asyncio.create_task(self._watch_node()),
        ]

    async def stop(self) -> None:
        """Stop every shard this agent started, then the loops and the client."""
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.shards.stop_all()
        if self._client is not None:
            await self._client.aclose()

    async def _heartbeats(self) -> None:
        interval_s = self.settings.heartbeat_interval_ms / 1000
        late_file = self.settings.late_heartbeats_file
        late = None if late_file is None else LateHeartbeats(late_file)
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval_s)
            late_ms = 0 if late is None else late.now_ms()
            if late_ms == 0:  # on time (the late ones still on their way may come after it)
                self._feed(HeartbeatDue())
                continue
            # held back (`late.py`): the report as it is now, posted later, in the order sent;
            # the core answers a heartbeat's timer with its report and nothing else
            assert late is not None
            report = self.core.heartbeat()
            loop.call_at(late.due(loop.time(), late_ms), self._enqueue, report, True)

    async def _watch_node(self) -> None:
        """Re-read the failed GPUs and the InfiniBand port state, several times a heartbeat: a
        change is reported at once (links down keep multi-node shards off the node), and the
        engines on a failed GPU are stopped."""
        interval_s = poll_interval_ms(self.settings.heartbeat_interval_ms) / 1000
        while True:
            await asyncio.sleep(interval_s)
            failed, links_up = await asyncio.to_thread(self.watch.read)
            for event in self.watch.changes(failed, links_up):
                log.warning("node %s: %s", self.info.node, event)
                self._feed(event)
            self._kill_on_failed_gpus()

    def _kill_on_failed_gpus(self) -> None:
        """SIGKILL the engine of every shard on a failed GPU (its exit is reported as any)."""
        for key in engines_on(self.watch.failed, self.core.shards()):
            pid = self.shards.describe(key).get("engine_pid")
            if isinstance(pid, int):
                log.error("shard %s/%d is on a failed GPU: killed", key.replica, key.rank)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)  # the engine leads its own group

    # --- the core ----------------------------------------------------------------------------

    def _feed(self, event: AgentEvent) -> int | None:
        """One core call and its commands, started in order; never awaits. Returns the epoch
        of a controller command the core refused (a deposed leader's), else None."""
        if self._stopping:
            return None
        step = self.core.handle(event)
        if step.refused is not None:
            log.warning(
                "command.refused: a command of epoch %d, after one of epoch %d (a deposed "
                "controller's)",
                step.refused,
                self.core.leader_epoch,
            )
            return step.refused
        for cmd in step.commands:
            match cmd:
                case StartSidecar(spec=spec):
                    self.shards.start_sidecar(spec)
                case StartEngine(spec=spec):
                    self.shards.start_engine(spec)
                    self._kill_on_failed_gpus()  # an engine on a failed GPU dies at once
                case StopShard(key=key, token=token):
                    self.shards.stop(key, token)
                case SendReport(report=report):
                    self._enqueue(report)
                case _:
                    assert_never(cmd)
        return None

    # --- reports to the controller -----------------------------------------------------------

    def _enqueue(self, report: Heartbeat | NodeRegistered, late: bool = False) -> None:
        if not self._stopping:
            self.reports.enqueue(report, late)

    def _report_asked(self) -> None:
        """The controller's answer asks for a registration."""
        self._feed(ReportRequested())

    # --- the API -----------------------------------------------------------------------------

    def _check_node(self, node: str) -> None:
        if node != self.info.node:
            raise Refused(f"this agent is node {self.info.node}, not {node}", 409)

    def assign(self, body: AssignShardsW) -> dict[str, Any]:
        self._check_node(body.node)
        cmd = body.to_core()
        for spec in cmd.shards:
            if spec.node != self.info.node:
                raise Refused(
                    f"shard {spec.replica}/{spec.rank} is for node {spec.node}, not "
                    f"{self.info.node}"
                )
            if any(g >= self.info.gpus for g in spec.gpus):
                raise Refused(
                    f"shard {spec.replica}/{spec.rank} wants GPUs {list(spec.gpus)}; node "
                    f"{self.info.node} has {self.info.gpus}"
                )
        self._refuse_if(self._feed(Assigned(cmd.shards, cmd.epoch)))
        return {"ok": True, "shards": len(cmd.shards)}

    def report_request(self, body: RequestReportW) -> dict[str, Any]:
        self._check_node(body.node)
        self._refuse_if(self._feed(ReportRequested(body.epoch)))
        return {"ok": True}

    def _refuse_if(self, refused: int | None) -> None:
        if refused is not None:
            raise Refused(
                f"epoch {refused} is older than epoch {self.core.leader_epoch}, which this agent "
                "has seen: the sender no longer leads",
                409,
            )

    def state(self) -> dict[str, Any]:
        shards = []
        for local in self.core.shards():
            key = local.spec.key
            shards.append(
                {
                    "replica": key.replica,
                    "rank": key.rank,
                    "phase": local.phase.value,
                    "argv": list(local.argv),
                    "endpoint": local.endpoint,
                    "exit_code": local.exit_code,
                    **self.shards.describe(key),
                }
            )
        return {
            "t_ms": self.now_ms(),
            "info": NodeInfoW.from_core(self.info).model_dump(mode="json"),
            "incarnation": self.incarnation,
            "shards": shards,
            "processes": self.shards.processes(),
            "history": [h.as_dict() for h in self.shards.history],
        }


_scheme = HTTPBearer(auto_error=False, description="the controller's token for this node")


async def _as_controller(
    request: Request, _token: Annotated[HTTPAuthorizationCredentials | None, Security(_scheme)]
) -> None:
    runtime: AgentRuntime = request.app.state.runtime
    if runtime.keys is not None:
        runtime.keys.require_controller(request)


def create_agent_app(runtime: AgentRuntime) -> FastAPI:
    app = FastAPI(
        title=f"llmgw-twin agent {runtime.info.node}",
        lifespan=lifespan_of(runtime),
        responses=ERRORS,
    )
    install_error_handlers(app)
    guard(app, lambda request: _as_controller(request, None))  # before any body is read
    app.state.runtime = runtime
    controller = [Depends(_as_controller)]

    @app.post("/v1/assign", dependencies=controller, responses=CONFLICT)
    async def assign(body: AssignShardsW) -> dict[str, Any]:
        return runtime.assign(body)

    @app.post("/v1/report-request", dependencies=controller, responses=CONFLICT)
    async def report_request(body: RequestReportW) -> dict[str, Any]:
        return runtime.report_request(body)

    @app.get("/v1/state", dependencies=controller)
    async def state() -> dict[str, Any]:
        return runtime.state()

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "node": runtime.info.node, "t_ms": runtime.now_ms()}

    return app
