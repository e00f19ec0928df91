"""Several controller processes on one store in a real run (`cluster.controllers: K`), and the
controllers' own faults done to them (docs/real-mode.md, docs/high-availability.md).

The controllers are named c1..cK, as the twin names them, and share the run's SQLite file; each
listens on a port of its own and says so in the store (`advertise_url`). c1 starts first and
leads; the others start once it does and stand by. Every agent's config lists every controller,
each through a proxy of the node's own (`NodeProcs.to_others`), so a node's partition cuts its
link to all of them; the router lists every controller's address.

Who leads is read from outside, every poll (`track`): each live controller that is not stalled
is asked its admin state; one that answers 200 leads, in the epoch it names, and a standby
answers 503. Its first answer as leader in an epoch is the run's `controller.leader` event (the
service writes none of its own); a controller that led and ended on its own (deposed: its
commit or renewal was refused, or its monotonic deadline passed, `leadership.py`) is the run's
`controller.deposed`, and the run, as the controller's supervisor, starts it again as a standby,
as the twin's deposed controller stays one. The harness's admin calls and the event log follow
whichever leads (`leading_url`): the log's numbering goes on across leaders, as it lives in the
store.

The faults: `kill_controller` is SIGKILL to the named one (or the leader), which stays down;
`restart_controller` kills the named one and starts it again, serving once the outage is over;
`stall_controller` stops it (SIGSTOP) and wakes it (SIGCONT) after the stall with its memory:
its commits are refused in its old epoch (fenced), and it ends and is started again as a standby.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, assert_never

import httpx
import yaml

from llmgw_twin.control.model import TraceEvent
from llmgw_twin.realmode.procs import killpg as _killpg
from llmgw_twin.twin.report.text import describe
from llmgw_twin.twin.scenario.model import (
    KillController,
    PartitionController,
    RestartController,
    Scenario,
    StallController,
    StoreDown,
)
from llmgw_twin.units import fmt_offset

if TYPE_CHECKING:
    from llmgw_twin.realmode.cluster import RealCluster
    from llmgw_twin.realmode.pgstore import RealPostgres

ControllerFault = (
    RestartController | KillController | StallController | PartitionController | StoreDown
)

PROBE_TIMEOUT_S = 0.5
"""How long one poll waits for a controller's answer (a stalled one gives none)."""
STARTUP_DEADLINE_S = 30.0
RESTARTS_MAX = 50
"""How often the run starts again a controller that ended on its own: bounded, as a
supervisor's restart limit is."""


def controller_names(k: int) -> list[str]:
    return [f"c{i + 1}" for i in range(k)]


def store_faults(scenario: Scenario) -> bool:
    """The scenario takes the store away (from one controller or from all)."""
    return any(
        isinstance(f.action, StoreDown)
        or (isinstance(f.action, PartitionController) and f.action.side == "store")
        for f in scenario.faults
    )


@dataclass
class ControllerProc:
    name: str
    port: int
    config: Path
    proc: subprocess.Popen[bytes] | None = None
    killed: bool = False
    """Killed by a fault: it stays down (no supervisor starts it again)."""
    stalled: bool = False
    epoch: int | None = None
    """The epoch this process was seen leading in (None: not seen leading)."""
    leading: bool = False
    restarts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class RealControllers:
    def __init__(self, cluster: RealCluster, names: list[str], ports: list[int]) -> None:
        self.cluster = cluster
        self.procs = {
            name: ControllerProc(name, port, cluster.workdir / f"controller-{name}.yaml")
            for name, port in zip(names, ports, strict=True)
        }
        self.events: list[TraceEvent] = []
        self._last_leader = names[0]
        self._recorder = names[0]
        self.now_ms: Callable[[], int] = lambda: 0
        self.progress: Callable[[str], None] = lambda _line: None

    @property
    def urls(self) -> list[str]:
        return [c.url for c in self.procs.values()]

    @property
    def leading_url(self) -> str:
        """The controller that leads now (else the one that led last)."""
        return self.procs[self._last_leader].url

    @property
    def reading(self) -> str:
        """The controller the harness reads from now."""
        return self._last_leader

    def tag(self, page: list[TraceEvent], reader: str) -> list[TraceEvent]:
        """A page of the log, each event with the controller that recorded it, as the twin's
        events of several controllers name it: the log read from `reader` is its
        predecessors' up to its start (the step that ends in its `controller.started`, all
        at one instant of its clock), its own from there."""
        starts = [i for i, ev in enumerate(page) if ev.kind == "controller.started"]
        first = len(page)
        if starts:
            first = starts[-1]
            while first > 0 and page[first - 1].t_ms == page[starts[-1]].t_ms:
                first -= 1
        out = []
        for i, ev in enumerate(page):
            if i == first:
                self._recorder = reader
            subjects = dict(ev.subjects)
            by = subjects.pop("controller", self._recorder)
            out.append(TraceEvent.of(ev.t_ms, ev.kind, controller=by, **subjects))
        return out

    def leaders(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.procs.values() if c.leading)

    @property
    def names(self) -> list[str]:
        return list(self.procs)

    def write_configs(self, base: Path, pg: RealPostgres | None) -> None:
        """One config per controller: the run's, with its name and its own port (and its own
        way to the store, when it is a server)."""
        config = yaml.safe_load(base.read_text())
        for c in self.procs.values():
            mine = dict(config)
            if pg is not None:
                mine["store"] = pg.url(c.name)
            mine["name"] = c.name
            mine["listen"] = {"host": "127.0.0.1", "port": c.port}
            mine["advertise_url"] = c.url
            c.config.write_text(yaml.safe_dump(mine, sort_keys=True))

    def start(self, name: str, not_before_ns: int | None = None) -> None:
        c = self.procs[name]
        args = ["controller", "--config", str(c.config)]
        if not_before_ns is not None:
            args += ["--not-before", str(not_before_ns)]
        c.proc = self.cluster._spawn(args, f"controller-{name}.log")
        c.epoch, c.leading, c.stalled, c.killed = None, False, False, False

    def start_all(self, headers: dict[str, str]) -> None:
        """c1 first, until it leads (its admin state answers); then the others, until each
        stands by (its health answers)."""
        first, *others = self.procs.values()
        self.start(first.name)
        assert first.proc is not None
        self.cluster.wait_healthy(first.url, first.proc)
        self._await(first, lambda r: r.status_code == 200, "/v1/admin/state", headers)
        first.leading = True
        for c in others:
            self.start(c.name)
        for c in others:
            self._await(c, lambda r: r.json().get("status") == "standby", "/health", headers)

    def _await(
        self,
        c: ControllerProc,
        ok: Callable[[httpx.Response], bool],
        path: str,
        headers: dict[str, str],
    ) -> None:
        deadline = time.monotonic() + STARTUP_DEADLINE_S
        with httpx.Client(timeout=1.0, headers=headers) as client:
            while time.monotonic() < deadline:
                assert c.proc is not None
                if c.proc.poll() is not None:
                    raise RuntimeError(f"controller {c.name} exited with {c.proc.returncode}")
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    if ok(client.get(c.url + path)):
                        return
                time.sleep(0.05)  # a process starting up: nothing to await but its answer
        raise RuntimeError(f"controller {c.name} did not get ready in {STARTUP_DEADLINE_S}s")

    # --- following who leads -------------------------------------------------------------------

    async def track(self, client: httpx.AsyncClient, until_ms: int, poll_s: float) -> None:
        while self.now_ms() < until_ms:
            await self.poll(client)
            await asyncio.sleep(poll_s)

    async def poll(self, client: httpx.AsyncClient) -> None:
        for c in self.procs.values():
            if c.proc is not None and c.proc.poll() is not None:
                self._ended(c)
        live = [c for c in self.procs.values() if c.proc is not None and not c.stalled]
        answers = await asyncio.gather(*(self._probe(client, c) for c in live))
        for c, epoch in zip(live, answers, strict=True):
            c.leading = epoch is not None
            if epoch is not None and epoch != c.epoch:
                c.epoch = epoch
                self._event("controller.leader", controller=c.name, epoch=epoch)
            if c.leading:
                self._last_leader = c.name

    async def _probe(self, client: httpx.AsyncClient, c: ControllerProc) -> int | None:
        """The epoch it leads in (None: it does not lead, or gave no answer)."""
        try:
            r = await client.get(f"{c.url}/v1/admin/state", timeout=PROBE_TIMEOUT_S)
            body: dict[str, Any] = r.json() if r.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            return None
        epoch = (body.get("leadership") or {}).get("epoch")
        return int(epoch) if isinstance(epoch, int) else None

    def _ended(self, c: ControllerProc) -> None:
        """A controller ended that no fault killed: deposed if it led; the supervisor starts
        it again, as a standby."""
        assert c.proc is not None
        code = c.proc.returncode
        c.proc = None
        if c.epoch is not None:
            self._event("controller.deposed", controller=c.name, epoch=c.epoch)
        else:
            log = self.cluster.workdir / "logs" / f"controller-{c.name}.log"
            last = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
            self.progress(f"controller {c.name} ended (exit {code}) without leading: {last}")
        if c.restarts < RESTARTS_MAX:  # loaded now, opening the store a retry later
            c.restarts += 1
            retry_ns = self.cluster.scenario.timings.lease_ms // 5 * 1_000_000
            self.start(c.name, not_before_ns=time.monotonic_ns() + retry_ns)

    def _event(self, kind: str, **subjects: Any) -> None:
        ev = TraceEvent.of(self.now_ms(), kind, **subjects)
        self.events.append(ev)
        self.progress(f"{fmt_offset(ev.t_ms)} {ev.kind} {describe(ev)}")

    # --- the faults ------------------------------------------------------------------------------

    def named(self, name: str | None) -> ControllerProc:
        """`leader` (or None): the one that leads now, else the one that led last."""
        if name in (None, "leader"):
            leading = self.leaders()
            return self.procs[leading[0] if leading else self._last_leader]
        assert name is not None
        return self.procs[name]

    async def inject(self, action: ControllerFault) -> None:
        pg = self.cluster.pg
        match action:
            case PartitionController(controller=name, for_ms=for_ms):
                assert pg is not None  # only `from: store` runs for real (`refusals.py`)
                cut = [self.named(name).name]
                pg.cut(cut)
                asyncio.get_running_loop().call_later(for_ms / 1000, pg.heal, cut)
            case StoreDown(for_ms=for_ms):
                assert pg is not None
                pg.cut(self.names)
                asyncio.get_running_loop().call_later(for_ms / 1000, pg.heal, self.names)
            case RestartController(controller=name, down_for_ms=down_for_ms):
                await asyncio.to_thread(self.restart, name, down_for_ms)
            case KillController(controller=name):
                await asyncio.to_thread(self.kill, name)
            case StallController(controller=name, for_ms=for_ms):
                self.stall(name, for_ms)
            case _:
                assert_never(action)

    def kill(self, name: str | None) -> None:
        c = self.named(name)
        c.killed = True
        self._kill(c)

    def _kill(self, c: ControllerProc) -> None:
        if c.proc is None:
            return
        _killpg(c.proc.pid, signal.SIGKILL)
        c.proc.wait(timeout=10)
        c.proc, c.leading, c.stalled = None, False, False

    def restart(self, name: str | None, down_for_ms: int) -> None:
        """Killed now; the next process loads during the outage and serves once it is over."""
        c = self.named(name)
        self._kill(c)
        self.start(c.name, not_before_ns=time.monotonic_ns() + down_for_ms * 1_000_000)

    def stall(self, name: str | None, for_ms: int) -> None:
        """Frozen now (SIGSTOP), woken after `for_ms` (SIGCONT) with its memory."""
        c = self.named(name)
        if c.proc is None or c.stalled:
            return
        proc = c.proc
        c.stalled, c.leading = True, False
        _killpg(proc.pid, signal.SIGSTOP)

        def wake() -> None:
            if c.proc is proc:
                c.stalled = False
                _killpg(proc.pid, signal.SIGCONT)

        asyncio.get_running_loop().call_later(for_ms / 1000, wake)

    def stop(self) -> list[subprocess.Popen[bytes]]:
        """Stalled ones are killed (a stopped process sits out a SIGTERM); the others are
        returned for the cluster to stop."""
        for c in self.procs.values():
            if c.stalled:
                self._kill(c)
        return [c.proc for c in self.procs.values() if c.proc is not None]
