"""The agent's shard processes: each shard's sidecar and engine, started, watched and stopped.

Role: carries out the agent core's `StartSidecar`, `StartEngine` and `StopShard` with real
processes (`processes.spawn`), and feeds back what it observes as core events: `SidecarUp` once
the sidecar answers `GET /health`; `EngineStarted` with the argv run; `EngineServing` /
`EngineJoined` by the readiness rule in `app.py`; after that, every rank is probed every
`probe_interval` (an agent setting, default 5 s: `EngineUnresponsive` after `PROBE_FAILURES`
misses, `EngineServing` or `EngineJoined` again on an answer): a leader through its sidecar, a
worker by its process's state (a stopped process answers nothing); `EngineExited` with the process's
code, or with one of `launcher`'s codes and the reason when the engine never ran or the agent
stopped it. The runner starts and stops; what runs as a shard's task in between (its sidecar
awaited, its engine watched and probed) is `shard_watch.ShardWatch`'s.

Invariants:
- A shard's command line is checked (its program, the launch policy: `launcher.checked_launch`)
  in `start_sidecar`, before its sidecar starts: a refused shard starts no process at all.
- An engine is started only by `start_engine`, which the core asks for only after `SidecarUp`;
  `history` records `sidecar-started`, `sidecar-up` and `engine-started` in that order.
- Events are fed from tasks or deferred with `call_soon`, never from inside the core call that
  issued the command, so reports reach the controller in the order the core made them.
- Every wait is bounded: the sidecar's start (`sidecar_timeout`), an engine's readiness
  (`ready_timeout`), a stop (`stop_grace`, then SIGKILL).
- A stopped shard's processes leave the table at once (a new shard may reuse its key) and are
  stopped as process groups in the background; `stop_all` waits for every stop.
- The run-state file (`runstate.py`) is rewritten whenever a shard's processes change, so that
  an agent started after this one dies finds them: `adopt` (before the core exists) reads it and
  takes over each shard whose sidecar and engine both still run (their ports reserved, the
  shard handed to the core in the phase it had), and `resume` (before the agent registers) ends
  each one partly gone and starts watching the adopted ones: by /proc, as they are no children.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from llmgw_twin.control.agent import LocalShard
from llmgw_twin.control.model import RENDEZVOUS_PORT_BASE, ShardKey, ShardSpec
from llmgw_twin.control.protocol import AgentEvent, EngineExited, EngineStarted, ShardStopped
from llmgw_twin.service.agent.config import AgentSettings
from llmgw_twin.service.agent.launcher import (
    EXIT_NO_PORT,
    EXIT_SPAWN_FAILED,
    Refusal,
    checked_launch,
    probe_for,
    sidecar_argv,
)
from llmgw_twin.service.agent.processes import PortPool, spawn, start_ticks, stop_group
from llmgw_twin.service.agent.runstate import Keeper, ShardProcs
from llmgw_twin.service.agent.shard_watch import (
    POLL_S,
    PROBE_FAILURES,
    SIDECAR_HOST,
    WATCH_S,
    ShardWatch,
)
from llmgw_twin.units import MAX_GPUS_PER_NODE

__all__ = [
    "ENGINE_PEER_PORTS",
    "HISTORY_KEPT",
    "POLL_S",
    "PROBE_FAILURES",
    "REASON_CHARS",
    "SIDECAR_HOST",
    "WATCH_S",
    "Happened",
    "ShardRunner",
]

log = logging.getLogger("llmgw_twin.agent")

ENGINE_PEER_PORTS = range(RENDEZVOUS_PORT_BASE, RENDEZVOUS_PORT_BASE + MAX_GPUS_PER_NODE)
"""The rendezvous and rank ports the controller gives a node's leaders and ranks (29500 plus
the first GPU's index, on the engine host): never handed out as a sidecar's or an HTTP port, or
a leader's HTTP port could take the rendezvous port its own replica binds next."""
HISTORY_KEPT = 1000
REASON_CHARS = 1000
"""A reason sent to the controller is cut to this length (the wire takes up to 4096)."""


@dataclass(frozen=True, slots=True)
class Happened:
    """One step in a shard's life, for `GET /v1/state` and for tests of the start order."""

    t_ms: int
    what: str
    replica: str
    rank: int
    pid: int | None = None
    detail: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}


class ShardRunner:
    def __init__(
        self,
        settings: AgentSettings,
        feed: Callable[[AgentEvent], object],
        now_ms: Callable[[], int],
        incarnation: int = 0,
    ) -> None:
        self.settings = settings
        self._feed = feed
        self._now_ms = now_ms
        self.incarnation = incarnation
        self._procs: dict[ShardKey, ShardProcs] = {}
        self._stopping: dict[asyncio.Task[None], ShardProcs] = {}
        self._ending: list[ShardProcs] = []
        """An earlier agent's shards partly gone, ended by `resume`."""
        hosts = (SIDECAR_HOST, settings.engine_host)
        self._ports = PortPool(settings.port_first, settings.port_last, hosts, ENGINE_PEER_PORTS)
        self._client: httpx.AsyncClient | None = None
        path = settings.run_state
        self._keeper = Keeper(path, incarnation) if path is not None else None
        self.history: collections.deque[Happened] = collections.deque(maxlen=HISTORY_KEPT)

    async def start(self) -> None:
        self._client = httpx.AsyncClient(timeout=2.0, trust_env=False)
        if self.settings.log_dir is not None:
            self.settings.log_dir.mkdir(parents=True, exist_ok=True)
        if self.settings.ready_dir is not None:
            self.settings.ready_dir.mkdir(parents=True, exist_ok=True)
        if self.settings.engines and not self.settings.policy.model_dirs:
            log.warning(
                "policy.model_dirs is empty: every engine but sim will be refused its model "
                "(see docs/services.md, the launch policy)"
            )

    async def stop_all(self) -> None:
        for key in list(self._procs):
            self.stop(key)
        if self._stopping:
            await asyncio.gather(*self._stopping, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()
        self._save()
        if self._keeper is not None:
            self._keeper.file.close()

    # --- an earlier agent's shards ---------------------------------------------------------

    def adopt(self) -> tuple[LocalShard, ...]:
        """Lock the run-state file and take over what an earlier agent of this node left
        (`Keeper.adopt`): the adopted shards, for the core. Raises `RunStateError` (or OSError)
        when the file cannot be locked, read or written: the agent must not start."""
        if self._keeper is None:
            return ()
        adopted, self._ending = self._keeper.adopt(self._ports)
        for procs in adopted:
            self._procs[procs.spec.key] = procs
            self._note("adopted", procs.spec, procs.engine.pid if procs.engine else None)
        self._save(raising=True)
        return tuple(p.local() for p in adopted)

    async def resume(self) -> None:
        """End the earlier agent's shards that are partly gone (waited for: their GPUs are free
        before the agent registers), and watch the adopted ones."""
        for procs in self._ending:
            codes = await Keeper.end(procs, self.settings.stop_grace_ms / 1000)
            self._note("ended", procs.spec, None, f"exit codes {codes}")
            self._ports.release(procs.sidecar_port)
            self._ports.release(procs.http_port)
        self._ending = []
        loop = asyncio.get_running_loop()
        for procs in self._procs.values():
            if procs.adopted and procs.task is None:
                procs.task = loop.create_task(self._watcher(procs).watch_engine())
        self._save()

    def _save(self, raising: bool = False) -> None:
        if self._keeper is not None:
            stopping = (*self._stopping.values(), *self._ending)
            self._keeper.save(self._procs.values(), stopping, raising)

    # --- what the core asks for --------------------------------------------------------------

    def start_sidecar(self, spec: ShardSpec) -> None:
        procs = ShardProcs(spec)
        self.stop(spec.key)  # defensive: the core stops a key before it starts it again
        self._procs[spec.key] = procs
        try:
            procs.sidecar_port = self._take_port()
            procs.http_port = self._take_port()
            procs.launch, procs.argv = checked_launch(self.settings, spec, procs.http_port)
            if procs.launch.port != procs.http_port:
                self._ports.release(procs.http_port)  # this rank listens elsewhere, or not at all
                procs.http_port = None
            procs.engine_port = procs.launch.port
            procs.probe = probe_for(self.settings, procs.launch)
            argv = sidecar_argv(spec, procs.sidecar_port, procs.probe)
            procs.sidecar = self._spawn(argv, None, spec, "sidecar")
        except Refusal as r:
            self._refuse(procs, r)
            return
        procs.sidecar_argv, procs.sidecar_ticks = argv, start_ticks(procs.sidecar.pid)
        self._save()
        self._note("sidecar-started", spec, procs.sidecar.pid, " ".join(argv))
        procs.task = asyncio.get_running_loop().create_task(self._watcher(procs).await_sidecar())

    def start_engine(self, spec: ShardSpec) -> None:
        procs = self._procs.get(spec.key)
        if procs is None or procs.launch is None or procs.engine is not None:
            log.error("shard %s/%d: engine asked for out of turn", spec.replica, spec.rank)
            return
        argv = procs.argv
        if procs.launch.ready_file is not None:  # an earlier engine's of this key, killed
            with contextlib.suppress(FileNotFoundError):
                os.unlink(procs.launch.ready_file)
        try:
            env = {**os.environ, **dict(procs.launch.env)}
            procs.engine = self._spawn(argv, env, spec, "engine")
        except Refusal as r:
            self._refuse(procs, r)
            return
        procs.engine_ticks = start_ticks(procs.engine.pid)
        procs.engine_started_ms = time.time_ns() // 1_000_000
        self._save()
        self._note("engine-started", spec, procs.engine.pid, " ".join(argv))
        loop = asyncio.get_running_loop()
        loop.call_soon(self._feed, EngineStarted(spec.key, argv))
        procs.task = loop.create_task(self._watcher(procs).watch_engine())

    def stop(self, key: ShardKey, token: int = 0) -> None:
        """Stop the shard's processes; `ShardStopped` with `token` follows once they ended."""
        procs = self._procs.pop(key, None)
        if procs is None:  # nothing of it runs: its GPUs are free now
            asyncio.get_running_loop().call_soon(self._feed, ShardStopped(key, token))
            return
        if procs.task is not None:
            procs.task.cancel()
        task = asyncio.get_running_loop().create_task(self._stop(procs, token))
        self._stopping[task] = procs
        task.add_done_callback(self._stopped)
        self._save()

    def _stopped(self, task: asyncio.Task[None]) -> None:
        self._stopping.pop(task, None)
        self._save()

    # --- views -------------------------------------------------------------------------------

    def describe(self, key: ShardKey) -> dict[str, Any]:
        procs = self._procs.get(key)
        if procs is None:
            return {}
        return {
            "sidecar_pid": procs.sidecar.pid if procs.sidecar is not None else None,
            "sidecar_port": procs.sidecar_port,
            "engine_pid": procs.engine.pid if procs.engine is not None else None,
            "engine_port": procs.http_port,
            "adopted": procs.adopted,
        }

    def processes(self) -> list[dict[str, Any]]:
        """Every process this runner started that may still run (running or being stopped)."""
        out = []
        for procs in [*self._procs.values(), *self._stopping.values(), *self._ending]:
            for role, proc in (("sidecar", procs.sidecar), ("engine", procs.engine)):
                if proc is not None and proc.returncode is None:
                    out.append(
                        {"replica": procs.spec.replica, "rank": procs.spec.rank, "role": role}
                        | {"pid": proc.pid}
                    )
        return out

    # --- helpers -----------------------------------------------------------------------------

    def _note(
        self, what: str, spec: ShardSpec, pid: int | None = None, detail: str | None = None
    ) -> None:
        self.history.append(Happened(self._now_ms(), what, spec.replica, spec.rank, pid, detail))

    def _take_port(self) -> int:
        port = self._ports.take()
        if port is None:
            s = self.settings
            raise Refusal(f"no free port left in {s.port_first}..{s.port_last}", EXIT_NO_PORT)
        return port

    def _spawn(
        self, argv: tuple[str, ...], env: dict[str, str] | None, spec: ShardSpec, role: str
    ) -> subprocess.Popen[bytes]:
        log_dir = self.settings.log_dir
        log_path = log_dir / f"{spec.replica}-{spec.rank}.{role}.log" if log_dir else None
        try:
            return spawn(argv, env, log_path)
        except OSError as e:
            raise Refusal(f"cannot start {argv[0]!r}: {e}", EXIT_SPAWN_FAILED) from None

    def _refuse(self, procs: ShardProcs, r: Refusal) -> None:
        spec = procs.spec
        log.error(
            "shard %s/%d (%s): %s; reported as exited with code %d",
            spec.replica,
            spec.rank,
            spec.engine,
            r,
            r.exit_code,
        )
        self._note("refused", spec, None, f"{r} (exit code {r.exit_code})")
        exited = EngineExited(spec.key, r.exit_code, _reason(str(r)))
        asyncio.get_running_loop().call_soon(self._feed, exited)

    async def _fail(self, procs: ShardProcs, message: str, exit_code: int) -> None:
        """The shard cannot go on: stop what runs of it and report it exited."""
        spec = procs.spec
        log.error(
            "shard %s/%d: %s; reported as exited with code %d",
            spec.replica,
            spec.rank,
            message,
            exit_code,
        )
        self._note("failed", spec, None, message)
        grace_s = self.settings.stop_grace_ms / 1000
        for proc in (procs.engine, procs.sidecar):
            if proc is not None:
                await stop_group(proc, grace_s)
        self._save()
        self._feed(EngineExited(spec.key, exit_code, _reason(message)))

    def _watcher(self, procs: ShardProcs) -> ShardWatch:
        """The shard's watch (`shard_watch.py`), for the task that runs it."""
        return ShardWatch(
            procs, self.settings, self._client, self._feed, self._note, self._save, self._fail
        )

    async def _stop(self, procs: ShardProcs, token: int) -> None:
        grace_s = self.settings.stop_grace_ms / 1000
        stops = [stop_group(p, grace_s) for p in (procs.engine, procs.sidecar) if p is not None]
        codes = await asyncio.gather(*stops)
        self._note("stopped", procs.spec, None, f"exit codes {codes}")
        self._ports.release(procs.sidecar_port)
        self._ports.release(procs.http_port)
        # only now may another shard take its GPUs
        self._feed(ShardStopped(procs.spec.key, token))


def _reason(message: str) -> str:
    return message if len(message) <= REASON_CHARS else message[:REASON_CHARS] + "..."
