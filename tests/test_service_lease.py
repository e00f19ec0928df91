"""The controller service's lease on a shared SQLite file: a second controller waits as a
standby, takes over in a higher epoch once the first stops renewing, and the first, fenced,
stops before it commits anything; its commands carry its epoch, and an agent that has seen a
higher one refuses them over HTTP. A leader held up past its deadline sends nothing until the
store renews its lease, and goes on if no one took over."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from helpers.services import FAST, eventually
from llmgw_twin.control.model import EngineName, NodeId, Profile, ProfileName
from llmgw_twin.control.protocol import ApplyProfile, RequestReport
from llmgw_twin.service.controller.app import ControllerRuntime
from llmgw_twin.service.controller.config import ControllerSettings

LEASE = replace(FAST, lease_ms=900)
T = TypeVar("T")


class Fatal(Exception):
    pass


def _runtime(store: Path, name: str, deaths: list[str], sent: list[Any]) -> ControllerRuntime:
    def agent(request: httpx.Request) -> httpx.Response:
        sent.append((name, request.url.path, json.loads(request.content)))
        return httpx.Response(200, json={"ok": True})

    def fatal(message: str) -> None:
        deaths.append(message)
        raise Fatal(message)

    settings = ControllerSettings("127.0.0.1", 0, str(store), LEASE, (), (), name=name)
    return ControllerRuntime(settings, agent_transport=httpx.MockTransport(agent), fatal=fatal)


def test_a_standby_takes_over_and_the_deposed_leader_commits_nothing(tmp_path: Path) -> None:
    store = tmp_path / "shared.db"
    deaths: list[str] = []
    sent: list[Any] = []

    async def go() -> None:
        first = _runtime(store, "c1", deaths, sent)
        await first.start()
        assert first.leadership.epoch == 1
        second = _runtime(store, "c2", deaths, sent)
        standby = asyncio.create_task(second.start())
        await asyncio.sleep(LEASE.lease_ms / 1000 / 2)
        assert not standby.done()  # c1 renews: c2 waits
        await first.leadership.stop()  # c1 freezes (its renewals stop), its memory intact
        await asyncio.wait_for(standby, timeout=30)
        assert second.leadership.epoch == 2
        # c1 wakes and decides something: its commit is refused, and it ends
        profile = Profile(ProfileName("p"), EngineName("sim"), 1, 1, "/models/p")
        step = first.core.handle(ApplyProfile(profile), first.now_ms())
        done = first._apply(step)
        assert done is not None
        with pytest.raises(RuntimeError, match="no longer in epoch 1"):
            await done
        assert any("epoch 1" in d for d in deaths)
        assert second.store.load().profiles == ()  # nothing of c1's landed
        await second.stop()
        await first.stop()

    asyncio.run(go())


def test_commands_carry_the_leaders_epoch(tmp_path: Path) -> None:
    sent: list[Any] = []

    async def go() -> None:
        rt = _runtime(tmp_path / "c.db", "c1", [], sent)
        await rt.start()
        transport = httpx.ASGITransport(app=_app(rt))
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
            body = {"info": _info("n1"), "shards": [], "incarnation": 1, "agent_url": "http://a"}
            assert (await client.post("/v1/agents/register", json=body)).is_success

            async def assigned() -> bool | None:
                return True if any(p == "/v1/assign" for _, p, _b in sent) else None

            await eventually(assigned, 10, "an assignment")
        await rt.stop()

    asyncio.run(go())
    bodies = [b for _, p, b in sent if p in ("/v1/assign", "/v1/report-request")]
    assert bodies and all(b["epoch"] == 1 for b in bodies)


def _app(rt: ControllerRuntime) -> Any:
    from llmgw_twin.service.controller.routes import create_controller_app

    return create_controller_app(rt)


def _info(node: str) -> dict[str, Any]:
    from helpers.services import node_info
    from llmgw_twin.service.common.wire import NodeInfoW

    return NodeInfoW.from_core(node_info(node)).model_dump(mode="json")


def _now(probe: Callable[[], T | None]) -> Callable[[], Awaitable[T | None]]:
    async def asked() -> T | None:
        return probe()

    return asked


def _held_up(rt: ControllerRuntime) -> None:
    """Hold the event loop well past the lease deadline, as an overloaded loop or a long
    blocking call does (the renewal task cannot run meanwhile)."""
    time.sleep(LEASE.lease_ms / 1000 * 1.5)
    assert not rt.leadership.may_act()


def test_a_leader_held_up_past_its_deadline_renews_when_no_one_took_over(tmp_path: Path) -> None:
    deaths: list[str] = []
    sent: list[Any] = []
    acting_when_sent: list[bool] = []

    async def go() -> None:
        rt = _runtime(tmp_path / "c.db", "c1", deaths, sent)
        await rt.start()
        rt._agent_urls[NodeId("n1")] = "http://agent-n1"
        original = rt.delivery._deliver

        async def deliver(cmd: Any, client: httpx.AsyncClient) -> bool:
            acting_when_sent.append(rt.leadership.may_act())
            return await original(cmd, client)

        rt.delivery._deliver = deliver  # type: ignore[method-assign]
        _held_up(rt)
        rt.delivery.send(RequestReport(NodeId("n1")))  # decided while past the deadline
        await eventually(_now(lambda: rt.leadership.late_renewals or None), 10, "a late renewal")
        await eventually(_now(lambda: sent or None), 10, "the held command, sent once renewed")
        assert rt.leadership.epoch == 1 and rt.leadership.may_act()
        await rt.stop()

    asyncio.run(go())
    assert deaths == []
    assert acting_when_sent == [True]  # never sent while past the deadline
    assert [(p, b["epoch"]) for _, p, b in sent] == [("/v1/report-request", 1)]


def test_a_leader_held_up_while_a_standby_took_over_ends_and_sends_nothing(
    tmp_path: Path,
) -> None:
    store = tmp_path / "shared.db"
    deaths: list[str] = []
    sent: list[Any] = []

    async def go() -> None:
        first = _runtime(store, "c1", deaths, sent)
        await first.start()
        first._agent_urls[NodeId("n1")] = "http://agent-n1"
        # while c1 is held up, the lease expires in the store's time and c2 claims it
        _held_up(first)
        second = _runtime(store, "c2", [], sent)
        await asyncio.wait_for(second.start(), timeout=30)
        assert second.leadership.epoch == 2
        first.delivery.send(RequestReport(NodeId("n1")))
        await eventually(_now(lambda: deaths or None), 10, "c1 to end")
        await second.stop()
        await first.stop()

    asyncio.run(go())
    # fenced: by its renewal or by its next commit, whichever came first
    assert deaths and all("epoch 1" in d for d in deaths), deaths
    assert [s for s in sent if s[0] == "c1"] == []
