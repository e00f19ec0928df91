"""A restarted controller gives the agents it asks for a report a whole reconcile interval to
answer, counted from when its requests were delivered, not from when it started or queued them:
a commit slow to reach the disk, or requests queued behind each other, must not use it up, or
healthy nodes silent through the outage would be judged at the first reconcile before they could
answer (declared lost, or the whole fleet taken for the controller's own partition).

In-process runtimes on one SQLite store, agents answered through a mock transport (each report
request answered with the node's heartbeat a quarter of an interval after it is delivered); the
outage is the second runtime's clock set ahead, past the lost window.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx

from helpers.services import eventually, node_info
from llmgw_twin.control.model import NodeId, Timings
from llmgw_twin.control.protocol import Heartbeat, NodeRegistered
from llmgw_twin.service.common.wire import HeartbeatW, NodeRegisteredW
from llmgw_twin.service.controller.app import ControllerRuntime
from llmgw_twin.service.controller.config import ControllerSettings
from llmgw_twin.service.controller.routes import create_controller_app

TIMINGS = Timings(
    heartbeat_interval_ms=200,
    node_suspect_after_ms=3_000,
    node_lost_after_ms=6_000,
    reconcile_interval_ms=200,
)
NODES = [f"n{i}" for i in range(1, 6)]
ANSWERING = NODES[:-1]  # n5 died during the outage
SLOW_COMMIT_S = 3 * TIMINGS.reconcile_interval_ms / 1000
ANSWER_S = TIMINGS.reconcile_interval_ms / 4 / 1000


def _registration(name: str) -> dict[str, Any]:
    msg = NodeRegistered(node_info(name, "ib-a"), (), incarnation=1)
    return NodeRegisteredW.from_core(msg, f"http://agent-{name}").model_dump(mode="json")


def _beat(name: str) -> dict[str, Any]:
    return HeartbeatW.from_core(Heartbeat(NodeId(name), (), ())).model_dump(mode="json")


def _kinds(runtime: ControllerRuntime, since: int = 0) -> list[tuple[str, object]]:
    """The events of the runtime's event log from number `since` on: kind and node."""
    return [(e.kind, e.as_dict().get("node")) for e in runtime._events[since:]]


def _settings(tmp_path: Path) -> ControllerSettings:
    return ControllerSettings("127.0.0.1", 0, str(tmp_path / "controller.db"), TIMINGS, (), ())


async def _first_life(settings: ControllerSettings) -> None:
    """Every node registers and one reconcile writes the store's clock; then the process stops."""
    idle = httpx.MockTransport(lambda r: httpx.Response(200, json={}))
    runtime = ControllerRuntime(settings, agent_transport=idle)
    await runtime.start()
    transport = httpx.ASGITransport(app=create_controller_app(runtime))
    async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
        for name in NODES:
            assert (await client.post("/v1/agents/register", json=_registration(name))).is_success

        async def joined() -> bool | None:
            return sum(k == "node.joined" for k, _ in _kinds(runtime)) == len(NODES) or None

        await eventually(joined, 10, "every node to join")
        first_due = runtime.core.reconcile_due_ms

        async def reconciled() -> bool | None:
            return runtime.core.reconcile_due_ms != first_due or None

        await eventually(reconciled, 10, "a reconcile")
    await runtime.stop()


def _judged(kinds: list[tuple[str, object]]) -> list[tuple[str, object]]:
    """The events up to the first judgement (`controller.started`), which must be:
    only the dead node lost, no healthy one suspect, no mass-loss hold."""
    first = kinds.index(("controller.started", None))
    judged = kinds[: first + 1]
    assert ("fleet.hold", None) not in judged, kinds
    assert [n for k, n in judged if k == "node.lost"] == ["n5"], kinds
    assert not [n for k, n in judged if k == "node.suspect" and n in ANSWERING], kinds
    return judged


def test_requests_delivered_late_leave_the_agents_their_interval_to_answer(
    tmp_path: Path,
) -> None:
    """A large fleet's report requests leave a few connections at a time (here one, each send
    held for two intervals by an agent slow to accept): the last node is asked several
    intervals after the start. The first judgement waits until every node asked has answered
    or an interval has passed since the last request was delivered, so none of the late ones
    is judged silent; the dead node, whose send fails, is lost at that judgement."""
    settings = _settings(tmp_path)
    accept_s = 2 * TIMINGS.reconcile_interval_ms / 1000

    async def second_life() -> list[tuple[str, object]]:
        answers: list[asyncio.Task[httpx.Response]] = []
        heard: list[httpx.AsyncClient] = []

        async def answer(node: str) -> httpx.Response:
            await asyncio.sleep(ANSWER_S)
            return await heard[0].post("/v1/agents/heartbeat", json=_beat(node))

        async def agents(request: httpx.Request) -> httpx.Response:
            node = request.url.host.removeprefix("agent-")
            if node not in ANSWERING:
                raise httpx.ConnectError("connection refused", request=request)
            if request.url.path == "/v1/report-request":
                await asyncio.sleep(accept_s)  # slow to accept: the connection is held
                answers.append(asyncio.create_task(answer(node)))
            return httpx.Response(200, json={})

        runtime = ControllerRuntime(settings, agent_transport=httpx.MockTransport(agents))
        runtime.delivery.max_in_flight = 1  # the fleet's requests queue behind each other
        before = len(runtime._events)
        runtime._epoch0_ms += 2 * TIMINGS.node_lost_after_ms  # the outage, on its clock
        transport = httpx.ASGITransport(app=create_controller_app(runtime))
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
            heard.append(client)
            await runtime.start()

            async def started() -> bool | None:
                return any(k == "controller.started" for k, _ in _kinds(runtime, before)) or None

            await eventually(started, 30, "the first reconcile")
            await asyncio.gather(*answers)
        await runtime.stop()
        return _kinds(runtime, before)

    asyncio.run(_first_life(settings))
    _judged(asyncio.run(second_life()))


def test_a_slow_first_commit_leaves_the_agents_their_interval_to_answer(tmp_path: Path) -> None:
    settings = _settings(tmp_path)

    async def second_life() -> list[tuple[str, object]]:
        answers: list[asyncio.Task[httpx.Response]] = []
        heard: list[httpx.AsyncClient] = []

        async def answer(node: str) -> httpx.Response:
            await asyncio.sleep(ANSWER_S)  # the agent's own latency, well inside the interval
            return await heard[0].post("/v1/agents/heartbeat", json=_beat(node))

        async def agents(request: httpx.Request) -> httpx.Response:
            node = request.url.host.removeprefix("agent-")
            if request.url.path == "/v1/report-request" and node in ANSWERING:
                answers.append(asyncio.create_task(answer(node)))
            return httpx.Response(200, json={})

        runtime = ControllerRuntime(settings, agent_transport=httpx.MockTransport(agents))
        before = len(runtime._events)  # the first life's, from the store
        runtime._epoch0_ms += 2 * TIMINGS.node_lost_after_ms  # the outage, on its clock
        commit = runtime.store.commit

        def slow_commit(*args: Any, **kwargs: Any) -> None:
            time.sleep(SLOW_COMMIT_S)  # a disk slow to sync (the committer's worker thread)
            commit(*args, **kwargs)

        runtime.store.commit = slow_commit  # type: ignore[method-assign]
        transport = httpx.ASGITransport(app=create_controller_app(runtime))
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
            heard.append(client)
            await runtime.start()

            async def started() -> bool | None:
                return any(k == "controller.started" for k, _ in _kinds(runtime, before)) or None

            await eventually(started, 30, "the first reconcile")
            await asyncio.gather(*answers)
        await runtime.stop()
        return _kinds(runtime, before)

    asyncio.run(_first_life(settings))
    _judged(asyncio.run(second_life()))
