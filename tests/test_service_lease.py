"""The controller service's lease on a shared SQLite file: a second controller waits as a
standby, takes over in a higher epoch once the first stops renewing, and the first, fenced,
stops before it commits anything; its commands carry its epoch, and an agent that has seen a
higher one refuses them over HTTP."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from helpers.services import FAST, eventually
from llmgw_twin.control.model import EngineName, Profile, ProfileName
from llmgw_twin.control.protocol import ApplyProfile
from llmgw_twin.service.controller.app import ControllerRuntime
from llmgw_twin.service.controller.config import ControllerSettings

LEASE = replace(FAST, lease_ms=900)


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
