"""The routing feed: the controller's side through its app (`httpx.ASGITransport`), its log's
bounds, who may read it; the router's side (`FeedFollower`) against scripted pages.

No sleeps: a long poll is shown to wake by awaiting its answer (with a deadline) after the
change that must wake it; the follower's progress is awaited through its counters.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import profile
from helpers.controller import Sent, controller, two_ready_replicas
from helpers.services import FAST, eventually
from llmgw_twin.control.model import ModelName, NodeId, ReplicaId, ReplicaState, TraceEvent
from llmgw_twin.control.replicas import ReplicaRecord
from llmgw_twin.control.routing import Router
from llmgw_twin.control.routing_feed import SnapshotEntry, SnapshotState, snapshot_of
from llmgw_twin.service.common.auth import new_token, token_hash
from llmgw_twin.service.common.config import ConfigError
from llmgw_twin.service.common.feed import FeedPageW, RoutingFeed, snapshot_wire
from llmgw_twin.service.controller.app import ControllerRuntime
from llmgw_twin.service.controller.config import (
    ControllerAuth,
    ControllerSettings,
    load_controller_config,
)
from llmgw_twin.service.controller.routes import create_controller_app
from llmgw_twin.service.router.follower import FeedFollower

DEADLINE_S = 20


async def feed(client: httpx.AsyncClient, **params: Any) -> dict[str, Any]:
    r = await client.get("/v1/router/feed", params=params)
    assert r.status_code == 200, r.text
    page: dict[str, Any] = r.json()
    return page


def test_a_router_gets_a_snapshot_then_only_the_events_after_it(tmp_path: Path) -> None:
    async def go() -> None:
        sent: Sent = []
        async with controller(tmp_path, sent) as (runtime, client):
            replicas = await two_ready_replicas(client, sent)
            first = await feed(client)
            assert first["epoch"] == runtime.feed.epoch and first["models"] == ["tiny"]
            assert first["events"] == []
            assert [(e["replica"], e["state"], e["endpoint"]) for e in first["snapshot"]] == [
                (r, "ready", f"http://engine-{r}:8000") for r in replicas
            ]
            at = {"after": first["next"], "epoch": first["epoch"]}
            assert await feed(client, **at) == first | {"snapshot": None}
            # another epoch (a restarted controller's), or a position it never had: resync
            for other in ({"epoch": "0123abcd"}, {"after": first["next"] + 5}):
                page = await feed(client, **(at | other))
                assert page["snapshot"] == first["snapshot"] and page["next"] == first["next"]

            # a long poll waits for news, and wakes as soon as there is some: a new model...
            waiting = asyncio.create_task(feed(client, **at, wait_ms=30_000))
            r = await client.put(
                "/v1/admin/deployments/tiny", json={"profile": "tiny", "replicas": 1}
            )
            assert r.status_code == 200, r.text
            woken = await asyncio.wait_for(waiting, DEADLINE_S)
            assert woken["snapshot"] is None and woken["models"] == ["tiny"]
            # ... or a routing event: the retired replica leaves
            page = await asyncio.wait_for(
                feed(client, after=woken["next"], epoch=first["epoch"], wait_ms=30_000),
                DEADLINE_S,
            )
            leaving = [e for e in page["events"] if e["kind"] == "replica.reaped"]
            assert [e["replica"] for e in leaving] == [replicas[1]], page
            assert page["next"] == woken["next"] + len(page["events"])
            assert runtime.feed.resyncs == 3  # the first read, and the two asked for above

    asyncio.run(go())


def test_the_feed_keeps_a_bounded_log_and_a_router_behind_it_resyncs() -> None:
    async def go() -> None:
        log = RoutingFeed(epoch="e1", kept=2)
        for i in range(4):
            ev = TraceEvent.of(
                i, "replica.ready", model="m", replica=f"m-r{i}", endpoint="http://x"
            )
            log.record(ev)
        log.record(TraceEvent.of(5, "node.suspect", node="n1"))  # not a routing event
        assert log.next == 4

        def snapshot() -> list[SnapshotEntry]:
            entry = SnapshotEntry(ModelName("m"), ReplicaId("m-r3"), SnapshotState.READY, "u")
            return [entry]

        behind = await log.read(0, "e1", 0, snapshot, lambda: ["m"])
        assert behind["snapshot"] == [
            {"model": "m", "replica": "m-r3", "state": "ready", "endpoint": "u"}
        ]
        assert behind["next"] == 4 and behind["events"] == []
        recent = await log.read(3, "e1", 0, snapshot, lambda: ["m"])
        assert recent["snapshot"] is None and [e["replica"] for e in recent["events"]] == ["m-r3"]
        # an idle read waits at most as asked: a zero wait answers at once with nothing
        idle = await log.read(4, "e1", 0, snapshot, lambda: ["m"])
        assert idle["events"] == [] and idle["next"] == 4

    asyncio.run(go())


def test_a_join_that_says_not_ready_reaches_a_router_as_a_leave() -> None:
    """A replica the restarted controller adopted while not serving: `replica.adopted` with its
    old endpoint and `ready: false` must take it out of a router's table, across the wire."""
    log = RoutingFeed(epoch="e1")
    log.record(TraceEvent.of(1, "replica.ready", model="m", replica="m-r1", endpoint="http://a"))
    adopted = TraceEvent.of(
        2, "replica.adopted", model="m", replica="m-r1", endpoint="http://a", ready=False
    )
    log.record(adopted)
    page = FeedPageW.model_validate(asyncio.run(log.read(0, "e1", 0, list, lambda: ["m"])))
    assert [(e.kind, e.ready) for e in page.events] == [
        ("replica.ready", None),
        ("replica.adopted", False),
    ]
    router = Router()
    follower = FeedFollower(router, "http://controller")
    follower.apply(page.model_copy(update={"events": page.events[:1]}))
    assert [r.replica for r in router.routes(ModelName("m"))] == ["m-r1"]
    follower.apply(page)
    assert router.routes(ModelName("m")) == []


def test_a_silent_node_takes_an_adopting_replica_out_of_a_routers_table() -> None:
    """A router resynced from a restarted controller keeps the route of a replica the controller
    is still adopting; when a node of it goes silent the controller's `replica.unroutable`
    reaches the router across the wire and drops it, and a router that resyncs later is not
    given it (the snapshot leaves out an adopting replica whose node is silent)."""
    log = RoutingFeed(epoch="e2")
    router = Router()
    router.follow(TraceEvent.of(1, "replica.ready", model="m", replica="m-r1", endpoint="http://a"))
    follower = FeedFollower(router, "http://controller")
    snapshot = [SnapshotEntry(ModelName("m"), ReplicaId("m-r1"), SnapshotState.ADOPTING)]
    first = FeedPageW.model_validate(
        asyncio.run(log.read(0, None, 0, lambda: snapshot, lambda: ["m"]))
    )
    follower.apply(first)
    assert [r.replica for r in router.routes(ModelName("m"))] == ["m-r1"]  # kept, not judged
    log.record(
        TraceEvent.of(2, "replica.unroutable", model="m", replica="m-r1", reason="node n1 suspect")
    )
    page = FeedPageW.model_validate(asyncio.run(log.read(first.next, "e2", 0, list, list)))
    follower.apply(page)
    assert router.routes(ModelName("m")) == []
    rec = ReplicaRecord(ReplicaId("m-r1"), ModelName("m"), profile("p"), 1, 0)
    rec.state = ReplicaState.ADOPTING
    assert snapshot_wire(snapshot_of([rec])) == [
        {"model": "m", "replica": "m-r1", "state": "adopting", "endpoint": None}
    ]
    rec.unroutable = frozenset({NodeId("n1")})
    assert snapshot_wire(snapshot_of([rec])) == []


def test_only_a_router_token_or_an_admin_token_reads_the_feed(tmp_path: Path) -> None:
    admin, api, router = new_token(), new_token(), new_token()
    auth = ControllerAuth(
        (token_hash(admin),), (token_hash(api),), tmp_path / "secret.key", (token_hash(router),)
    )
    settings = ControllerSettings("127.0.0.1", 0, str(tmp_path / "c.db"), FAST, (), (), auth=auth)

    async def go() -> None:
        runtime = ControllerRuntime(settings)
        await runtime.start()
        transport = httpx.ASGITransport(app=create_controller_app(runtime))
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
                for token, status in [
                    (None, 401),
                    (new_token(), 401),
                    (api, 403),
                    (router, 200),
                    (admin, 200),
                ]:
                    headers = {"authorization": f"Bearer {token}"} if token else {}
                    r = await client.get("/v1/router/feed", headers=headers)
                    assert r.status_code == status, (token, r.text)
                # a router token is for the feed alone
                headers = {"authorization": f"Bearer {router}"}
                for method, path in [("GET", "/v1/admin/state"), ("GET", "/v1/models")]:
                    r = await client.request(method, path, headers=headers)
                    assert r.status_code == 403, (path, r.text)
                    assert r.json()["detail"].startswith(
                        "a router credential may not call this endpoint"
                    )
        finally:
            await runtime.stop()

    asyncio.run(go())


def test_router_token_hashes_in_the_controller_config_are_checked(tmp_path: Path) -> None:
    good = token_hash(new_token())
    (tmp_path / "c.yaml").write_text(
        "listen: {port: 8080}\nstore: c.db\n"
        f"auth: {{admin_tokens: ['{good}'], router_tokens: ['{good}'], "
        f"reader_tokens: ['{good}']}}\n"
    )
    auth = load_controller_config(tmp_path / "c.yaml").auth
    assert auth is not None and auth.router_hashes == (good,) and auth.reader_hashes == (good,)
    (tmp_path / "bad.yaml").write_text(
        "listen: {port: 8080}\nstore: c.db\n"
        f"auth: {{admin_tokens: ['{good}'], router_tokens: [lgw_not_a_hash]}}\n"
    )
    with pytest.raises(ConfigError, match=r"auth\.router_tokens\[0\]: expected a token hash"):
        load_controller_config(tmp_path / "bad.yaml")
    (tmp_path / "bad.yaml").write_text(
        "listen: {port: 8080}\nstore: c.db\n"
        f"auth: {{admin_tokens: ['{good}'], reader_tokens: [lgw_not_a_hash]}}\n"
    )
    with pytest.raises(ConfigError, match=r"auth\.reader_tokens\[0\]: expected a token hash"):
        load_controller_config(tmp_path / "bad.yaml")


# --- the router's side ------------------------------------------------------------------------


def entry(replica: str, state: str = "ready") -> dict[str, Any]:
    endpoint = f"http://{replica}:8000" if state == "ready" else None
    return {"model": "m", "replica": replica, "state": state, "endpoint": endpoint}


def page(epoch: str, nxt: int, snapshot: list[Any] | None, events: list[Any]) -> dict[str, Any]:
    return {"epoch": epoch, "next": nxt, "models": ["m"], "snapshot": snapshot, "events": events}


def test_the_follower_resumes_keeps_its_table_while_the_controller_is_down_and_resyncs(
    tmp_path: Path,
) -> None:
    token_file = tmp_path / "router.token"
    token_file.write_text("lgw_first\n")
    leave = {"t_ms": 1, "kind": "replica.failed", "model": "m", "replica": "m-r2"}
    answers: list[httpx.Response | Exception] = [
        httpx.Response(200, json=page("e1", 3, [entry("m-r1"), entry("m-r2")], [])),
        httpx.Response(200, json=page("e1", 4, None, [leave])),
        httpx.ConnectError("the controller is down"),
        httpx.Response(200, content=b'{"epoch": 5}'),  # not a page: changes nothing
        httpx.Response(401, json={"detail": "invalid credentials"}),
        # a new controller: m-r1 restored and not judged yet, m-r3 new
        httpx.Response(200, json=page("e2", 0, [entry("m-r1", "adopting"), entry("m-r3")], [])),
    ]
    asked: list[tuple[dict[str, str], str | None]] = []
    gates = [asyncio.Event() for _ in range(len(answers) + 1)]
    """The test lets the scripted controller answer poll i by setting gates[i]."""

    async def controller_feed(request: httpx.Request) -> httpx.Response:
        asked.append((dict(request.url.params), request.headers.get("authorization")))
        await gates[len(asked) - 1].wait()  # the last one: a long poll with no news
        answer = answers.pop(0)
        if len(asked) == 4:  # rotated while the router was refused
            token_file.write_text("lgw_second\n")
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def go() -> None:
        router = Router()
        follower = FeedFollower(
            router,
            "http://controller",
            token_file=token_file,
            wait_ms=1_000,
            reconnect_max_ms=200,
            transport=httpx.MockTransport(controller_feed),
        )
        follower.start()
        try:

            def routes() -> list[str]:
                return [r.replica for r in router.routes(ModelName("m"))]

            async def after(pages: int) -> bool | None:
                return True if follower.pages >= pages else None

            gates[0].set()
            gates[1].set()
            await eventually(lambda: after(2), DEADLINE_S, "two pages applied")
            assert routes() == ["m-r1"] and follower.connected and follower.next == 4

            async def asked_again(polls: int) -> bool | None:
                return True if len(asked) >= polls else None

            for i in (2, 3, 4):
                gates[i].set()
            await eventually(lambda: asked_again(6), DEADLINE_S, "the down, bad, refused polls")
            assert routes() == ["m-r1"], "a controller that is down changes nothing"
            assert not follower.connected and follower.pages == 2
            gates[5].set()
            await eventually(lambda: after(3), DEADLINE_S, "the new controller's snapshot")
            assert routes() == ["m-r1", "m-r3"] and follower.epoch == "e2"
            assert (follower.resyncs, follower.disconnects) == (2, 1)
        finally:
            await follower.stop()
        params = [p for p, _ in asked]
        assert params[0] == {"after": "0", "wait_ms": "1000"}
        assert params[1] == {"after": "3", "epoch": "e1", "wait_ms": "1000"}
        assert all(p == params[2] for p in params[2:6])  # resumed from where it was
        assert params[2] == {"after": "4", "epoch": "e1", "wait_ms": "1000"}
        tokens = [t for _, t in asked]
        assert tokens[:5] == ["Bearer lgw_first"] * 5 and tokens[5] == "Bearer lgw_second"
        json.dumps(follower.view())

    asyncio.run(go())


def test_a_router_follows_the_feed_of_the_controller_that_leads() -> None:
    """Given every controller's address, the router reads the feed where it is answered: the
    first controller does not answer (a standby, or a leader gone), the second does."""

    async def controllers(request: httpx.Request) -> httpx.Response:
        if request.url.host == "c1":
            raise httpx.ConnectError("connection refused", request=request)
        await asyncio.sleep(0.05)  # a long poll: nothing new for a while
        page = {"epoch": "c2-run", "next": 1, "models": ["m"], "snapshot": [], "events": []}
        return httpx.Response(200, json=page)

    async def go() -> None:
        follower = FeedFollower(
            Router(),
            "http://c1:8080",
            others=("http://c2:8080",),
            wait_ms=1_000,
            reconnect_max_ms=200,
            transport=httpx.MockTransport(controllers),
        )
        follower.start()
        try:

            async def following() -> bool | None:
                return True if follower.connected else None

            await eventually(following, 10, "the router to follow the second controller")
            assert follower.url == "http://c2:8080/v1/router/feed"
            assert follower.epoch == "c2-run" and follower.models == ["m"]
        finally:
            await follower.stop()

    asyncio.run(go())
