"""The controller's own lag is not node silence: the core moves every node's last heartbeat
later by a lag its shell reports, and the production shell measures its event loop's lateness,
reports it, says so in its state, and sheds state views while behind."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from conftest import profile
from helpers.services import eventually, node_info
from llmgw_twin.control.controller import Controller
from llmgw_twin.control.model import (
    Deployment,
    ModelName,
    NodeId,
    ProfileName,
    ShardReport,
    ShardState,
    Timings,
)
from llmgw_twin.control.protocol import (
    ApplyDeployment,
    ApplyProfile,
    ControllerLagged,
    Heartbeat,
    NodeRegistered,
    Step,
)
from llmgw_twin.service.controller import lag
from llmgw_twin.service.controller.app import ControllerRuntime
from llmgw_twin.service.controller.config import ControllerSettings
from llmgw_twin.service.controller.routes import create_controller_app

T = Timings(node_suspect_after_ms=30_000, node_lost_after_ms=60_000)


def timeline(lagged_ms: int | None) -> list[tuple[int, str, str | None]]:
    """Two nodes heard at 0; at 50 s the controller reports a lag (or not), n2 is heard at
    55 s; every node event up to 95 s, and the lag's own event."""
    c = Controller(T)
    c.start(0)
    for n in ("n1", "n2"):
        c.handle(NodeRegistered(node_info(n), (), incarnation=1), 0)
    out: list[tuple[int, str, str | None]] = []
    for t in range(1_000, 95_001, 1_000):
        steps = []
        if t == 50_000 and lagged_ms is not None:
            steps.append(c.handle(ControllerLagged(lagged_ms), t))
        if t == 55_000:
            steps.append(c.handle(Heartbeat(NodeId("n2")), t))
        steps.append(c.tick(t))
        for step in steps:
            for e in step.events:
                if e.kind.startswith(("node.", "controller.lagged")):
                    subjects = dict(e.subjects)
                    out.append((t, e.kind, str(subjects.get("node", subjects.get("lag_ms")))))
    return out


def test_a_reported_lag_moves_every_nodes_silence_later_by_that_much() -> None:
    common = [(30_000, "node.suspect", "n1"), (30_000, "node.suspect", "n2")]
    back = (55_000, "node.recovered", "n2")
    again = (85_000, "node.suspect", "n2")
    assert timeline(None) == [*common, back, (60_000, "node.lost", "n1"), again]
    # 20 s of the controller's own lag at 50 s: n1's silence counts from 20 s, lost at 80 s
    lagged = (50_000, "controller.lagged", "20000")
    assert timeline(20_000) == [*common, lagged, back, (80_000, "node.lost", "n1"), again]
    # a lag never moves a silence past the present: 40 s at 50 s counts n1 from 40 s on
    lagged = (50_000, "controller.lagged", "40000")
    assert timeline(40_000) == [*common, lagged, back, again]


def test_a_lag_is_a_positive_duration() -> None:
    c = Controller(T)
    c.start(0)
    with pytest.raises(ValueError, match="positive"):
        c.handle(ControllerLagged(0), 1)


def test_the_shell_measures_its_own_lag_reports_it_and_sheds_state_views(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lag, "TOLERANCE_MS", 300)

    async def go() -> None:
        settings = ControllerSettings("127.0.0.1", 0, str(tmp_path / "c.db"), T, (), ())
        runtime = ControllerRuntime(settings)
        app = create_controller_app(runtime)
        await runtime.start()
        try:
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://c"
            ) as client:
                assert (await client.get("/v1/admin/state")).json()["controller"]["behind"] is False

                async def watching() -> bool | None:
                    return runtime.lag.watching or None

                await eventually(watching, 5, "the lag monitor measuring")
                time.sleep(0.8)  # the event loop blocked: the controller itself is behind

                async def reported() -> bool | None:
                    return runtime.lag.episodes > 0 or None

                await eventually(reported, 5, "the lag measured")
                r = await client.get("/v1/admin/state")
                assert r.status_code == 503 and r.headers["retry-after"] == "5"
                assert "behind" in r.json()["detail"]
                events = (await client.get("/v1/admin/events")).json()["events"]
                [lagged] = [e for e in events if e["kind"] == "controller.lagged"]
                assert lagged["subjects"]["lag_ms"] >= 500
                assert runtime.lag.view()["lag_forgiven_ms"] == lagged["subjects"]["lag_ms"]
        finally:
            await runtime.stop()

    asyncio.run(go())


SHORT = Timings(
    heartbeat_interval_ms=100,
    node_suspect_after_ms=400,
    node_lost_after_ms=800,
    reconcile_interval_ms=100,
)


def test_a_step_longer_than_the_lost_window_declares_no_node_lost_that_kept_heartbeating(
    tmp_path: Path,
) -> None:
    """A core step that blocks the loop longer than `node_lost_after` (a huge scale-down, a
    collector pause inside it) is followed at once by the next tick, before the lag probe runs:
    that tick must know how late the controller is, or it reads its own stall as the fleet's
    silence. The nodes heartbeat on time throughout; only the controller cannot hear them."""

    async def go() -> list[str]:
        settings = ControllerSettings("127.0.0.1", 0, str(tmp_path / "c.db"), SHORT, (), ())
        runtime = ControllerRuntime(settings)
        await runtime.start()
        nodes = [NodeId("n1"), NodeId("n2")]
        stop = asyncio.Event()

        async def agents() -> None:  # each node heartbeats every interval, bounded
            for _ in range(400):
                if stop.is_set():
                    return
                for n in nodes:
                    await runtime.heard(Heartbeat(n, incarnation=1), None)
                await asyncio.sleep(SHORT.heartbeat_interval_ms / 1000)

        try:
            for n in nodes:  # as an agent's registration is handled, less its address
                await runtime._handle(NodeRegistered(node_info(str(n)), (), incarnation=1))
            beats = asyncio.create_task(agents())

            async def watching() -> bool | None:
                return runtime.lag.watching or None

            await eventually(watching, 5, "the lag monitor measuring")
            core, ticks = runtime.core, {"stalled": 0, "after": 0}
            real_tick = core.tick

            def stalling_tick(now_ms: int) -> Step:
                step = real_tick(now_ms)
                if not ticks["stalled"]:
                    ticks["stalled"] = 1
                    time.sleep(1.6)  # twice the lost window, the loop blocked
                else:
                    ticks["after"] += 1
                return step

            core.tick = stalling_tick  # type: ignore[method-assign]

            async def judged_after() -> bool | None:  # ticks enough to have lost the nodes
                return ticks["after"] >= 10 or None

            await eventually(judged_after, 20, "ten ticks after the stall")
            stop.set()
            await beats
            return [e.kind for e in runtime._events]
        finally:
            stop.set()
            await runtime.stop()

    kinds = asyncio.run(go())
    assert "controller.lagged" in kinds
    assert "node.lost" not in kinds, kinds
    assert "node.suspect" not in kinds, kinds


def _failures_with_lag(lag_ms: int | None) -> list[int]:
    """A replica loading (never ready), its nodes heard every 10 s; a lag told at 90 s: the
    times at which a replica fails for missing its start deadline, up to 200 s."""
    c = Controller(T)
    c.start(0)
    c.handle(ApplyProfile(profile("p")), 0)
    for n in ("n1", "n2"):
        c.handle(NodeRegistered(node_info(n), (), incarnation=1), 0)
    c.handle(ApplyDeployment(Deployment(ModelName("m"), ProfileName("p"), 1)), 0)
    failed = []
    for t in range(1_000, 200_001, 1_000):
        steps = []
        if t % 10_000 == 0:
            for n in c.nodes():
                shards = tuple(
                    ShardReport(s, ShardState.STARTING, None, None, ("e", str(s.rank)))
                    for s in c.assigned(n)
                )
                steps.append(c.handle(Heartbeat(n, shards, incarnation=1), t))
        if t == 90_000 and lag_ms is not None:
            steps.append(c.handle(ControllerLagged(lag_ms), t))
        steps.append(c.tick(t))
        failed += [t for s in steps for e in s.events if e.kind == "replica.failed"]
    return failed


def test_a_lag_moves_every_start_deadline_later_by_that_much() -> None:
    plain = _failures_with_lag(None)
    lagged = _failures_with_lag(30_000)
    assert plain and lagged
    assert lagged[0] == plain[0] + 30_000
