"""The heartbeat's short way (`controller/fastpath.py`) answers exactly as the FastAPI route does:
two controllers with credentials get the same requests, one with the short way and one with it
stepped over, and every answer (status, body, headers) is the same; the short way answered the
good heartbeats itself and left every other request to FastAPI."""

from __future__ import annotations

import asyncio
import json
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from helpers.services import eventually
from llmgw_twin.control.model import ReplicaId, ShardReport, ShardState
from llmgw_twin.service.controller.fastpath import HeartbeatFastPath
from test_auth import Fleet, fleet, heartbeat

PATH = "/v1/agents/heartbeat"
Request = tuple[dict[str, str], bytes]  # headers, body


def json_body(value: Any) -> bytes:
    return json.dumps(value).encode()


async def requests(f: Fleet) -> list[Request]:
    """Every kind of heartbeat, against a fleet whose n1 holds a ready replica."""
    n1, n2 = f.auth(f.nodes["n1"]), f.auth(f.nodes["n2"])
    as_json = {"content-type": "application/json"}
    (spec,) = f.runtime.core.assigned(f.runtime.core.nodes()[0])
    mine = ShardReport(spec, ShardState.SERVING, "http://agent-n1:8000", None)
    good = json_body(heartbeat("n1", mine))
    return [
        ({**as_json, **n1}, good),
        ({**as_json, **n1}, json_body(heartbeat("n1"))),  # its shard gone: a change
        ({**as_json, **n1}, good),
        ({**as_json, **n2}, json_body(heartbeat("n2"))),
        ({**as_json, **n2}, good),  # n2 speaking for n1
        ({**as_json, **n2}, json_body(heartbeat("n2", mine))),  # n2 reporting n1's shard
        (as_json, good),  # no token
        ({**as_json, **f.auth("lgw_" + "0" * 64)}, good),  # a token of nobody's
        ({**as_json, **f.auth(f.admin)}, good),  # another kind
        ({**as_json, "authorization": "Basic abc"}, good),
        ({**as_json, **n1}, b'{"node": "n1"'),  # not JSON
        ({**as_json, **n1}, json_body({"node": "n1", "shards": "x"})),  # not a heartbeat
        ({**as_json, **n1}, json_body({**heartbeat("n1"), "extra": 1})),
        ({"content-type": "text/plain", **n1}, good),
        (n1, good),  # no content type
        ({"content-type": "application/json; charset=utf-8", **n1}, good),
        ({**as_json, **n1}, b"x" * (9 * 1024 * 1024)),  # over the body limit
    ]


async def ready_fleet(stack: AsyncExitStack, tmp_path: Path) -> Fleet:
    f = await stack.enter_async_context(fleet(tmp_path))
    await f.onboard("n1")
    await f.onboard("n2")
    for node in ("n1", "n2"):
        assert await f.register(node, f.nodes[node]) == 200
    profile = {"engine": "sim", "nodes": 1, "gpus_per_node": 8, "model": "/models/tiny"}
    admin = f.auth(f.admin)
    assert (await f.client.put("/v1/admin/profiles/p", json=profile, headers=admin)).is_success
    deployment = {"profile": "p", "replicas": 1}
    r = await f.client.put("/v1/admin/deployments/m", json=deployment, headers=admin)
    assert r.is_success

    async def placed() -> bool | None:
        return True if any(f.runtime.core.assigned(n) for n in f.runtime.core.nodes()) else None

    await eventually(placed, 10, "the replica placed")
    return f


def answer(r: httpx.Response) -> tuple[int, bytes, str | None, str | None]:
    return (
        r.status_code,
        r.content,
        r.headers.get("content-type"),
        r.headers.get("www-authenticate"),
    )


def layer_of(f: Fleet) -> HeartbeatFastPath:
    app = f.client._transport.app  # type: ignore[attr-defined]
    layer = app.middleware_stack
    while not isinstance(layer, HeartbeatFastPath):
        layer = layer.app
    return layer


def test_the_short_way_answers_every_heartbeat_as_fastapi_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    short = HeartbeatFastPath.__call__

    async def stepped_over(self: HeartbeatFastPath, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)

    async def go() -> None:
        async with AsyncExitStack() as stack:
            fast = await ready_fleet(stack, tmp_path / "fast")
            slow = await ready_fleet(stack, tmp_path / "slow")
            fast_requests, slow_requests = await requests(fast), await requests(slow)
            answers: dict[str, list[Any]] = {"fast": [], "slow": []}
            for (fh, fb), (sh, sb) in zip(fast_requests, slow_requests, strict=True):
                monkeypatch.setattr(HeartbeatFastPath, "__call__", short)
                answers["fast"].append(answer(await fast.client.post(PATH, content=fb, headers=fh)))
                monkeypatch.setattr(HeartbeatFastPath, "__call__", stepped_over)
                answers["slow"].append(answer(await slow.client.post(PATH, content=sb, headers=sh)))
            # the tokens differ between the two fleets, nothing else does
            assert answers["fast"] == answers["slow"]
            statuses = [a[0] for a in answers["fast"]]
            assert statuses == [200, 200, 200, 200, 403, 403, 401, 401, 403, 401,
                                422, 422, 422, 422, 422, 200, 413]  # fmt: skip
            monkeypatch.setattr(HeartbeatFastPath, "__call__", short)
            # the five good heartbeats took the short way (the body limit in front of it
            # refused the oversized one; every other request went on to FastAPI)
            assert layer_of(fast).answered == 5
            assert layer_of(slow).answered == 0
            # and what they did is the same: the first replica lost its shard to the second
            # heartbeat on both (what placement does next runs on each one's own clock)
            first = [f.runtime.core.replica(ReplicaId("m-r1")) for f in (fast, slow)]
            assert [r.state.value if r else None for r in first] == ["reaped", "reaped"]

    asyncio.run(go())
