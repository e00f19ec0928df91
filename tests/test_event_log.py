"""The controller's event log (`GET /v1/admin/events`) lives in its store: a restarted controller
serves the events of the one before with the same numbers, then its own, numbered on; only the
newest `events_kept` are kept; and events ride in the steps' batched commits."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from helpers.controller import PROFILE, controller, registration
from helpers.live import live_controller
from helpers.services import wait_sync
from llmgw_twin.service.common.config import ConfigError
from llmgw_twin.service.controller.app import ControllerRuntime
from llmgw_twin.service.controller.config import ControllerSettings, load_controller_config
from llmgw_twin.service.controller.routes import create_controller_app
from llmgw_twin.store.sqlite import EVENTS_KEPT
from test_ctl_status import STEADY  # no node goes suspect: every event is one the test made

KEPT = 6


def _build(db: Path) -> FastAPI:
    settings = ControllerSettings("127.0.0.1", 0, str(db), STEADY, (), (), events_kept=KEPT)
    agents = httpx.MockTransport(lambda _: httpx.Response(200, json={"ok": True}))
    return create_controller_app(ControllerRuntime(settings, agent_transport=agents))


def _page(client: httpx.Client, after: int) -> dict[str, Any]:
    r = client.get("/v1/admin/events", params={"after": after})
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def _numbered(client: httpx.Client, after: int) -> dict[int, dict[str, Any]]:
    """Every event the log serves from `after` on, by its number (first after `dropped`)."""
    page = _page(client, after)
    first = page["next"] - len(page["events"])
    return {first + i: ev for i, ev in enumerate(page["events"])}


def _stored(db: Path) -> list[int]:
    with sqlite3.connect(db) as raw:
        return [int(seq) for (seq,) in raw.execute("SELECT seq FROM events ORDER BY seq")]


def test_a_restarted_controller_serves_the_events_before_it_with_their_numbers_then_its_own(
    tmp_path: Path,
) -> None:
    db = tmp_path / "c.db"
    with live_controller(lambda: _build(db)) as url, httpx.Client(base_url=url, timeout=30) as c:
        for name in ("n1", "n2", "n3"):
            assert c.post("/v1/agents/register", json=registration(name)).status_code == 200
        assert c.put("/v1/admin/profiles/tiny", json=PROFILE).status_code == 200
        r = c.put("/v1/admin/deployments/tiny", json={"profile": "tiny", "replicas": 3})
        assert r.status_code == 200

        def placed() -> dict[int, dict[str, Any]] | None:
            seen = _numbered(c, 0)  # fewer than 2 * KEPT: the memory log still has them all
            kinds = [ev["kind"] for ev in seen.values()]
            return seen if kinds.count("replica.placed") == 3 else None

        before = wait_sync(placed, 10, "three replica.placed events")
        assert min(before) == 0
        end = max(before) + 1
        assert end > KEPT  # more than the bound: the oldest are gone from the store
        assert _page(c, 0)["next"] == end
        # in the store: the newest KEPT, committed before they were served
        assert _stored(db) == list(range(end - KEPT, end))
        mid = end - 2  # where a reader of the log had got to

    with live_controller(lambda: _build(db)) as url, httpx.Client(base_url=url, timeout=30) as c:
        page = _page(c, 0)
        assert page["dropped"] == end - KEPT
        served = _numbered(c, 0)
        assert min(served) == end - KEPT
        # the same events under the same numbers, as far as the store kept them (the new
        # controller may have added its own after them already)
        old = {n: ev for n, ev in served.items() if n < end}
        assert old == {n: ev for n, ev in before.items() if n >= end - KEPT}

        def started() -> dict[int, dict[str, Any]] | None:
            seen = _numbered(c, mid)
            kinds = [ev["kind"] for ev in seen.values()]
            return seen if "controller.started" in kinds else None

        after = wait_sync(started, 10, "the restarted controller's controller.started")
        # the reader goes on from where it was: the old events it had not read, then the new
        assert [after[mid], after[mid + 1]] == [before[mid], before[mid + 1]]
        new = {n: ev for n, ev in after.items() if n >= end}
        assert "controller.started" in [ev["kind"] for ev in new.values()]
        assert all(ev["kind"] != "node.joined" for ev in new.values())
        last = _page(c, 0)["next"]
        assert _page(c, last)["events"] == []
    # the bound holds across the restart, and the numbers went on
    assert _stored(db) == list(range(last - KEPT, last))


def test_a_registration_storm_stores_its_events_in_a_few_transactions(tmp_path: Path) -> None:
    count = 200

    async def go() -> None:
        async with controller(tmp_path) as (runtime, client):
            before = runtime.committer.transactions

            async def register(i: int) -> None:
                r = await client.post("/v1/agents/register", json=registration(f"n{i:03d}"))
                assert r.status_code == 200, r.text

            await asyncio.gather(*(register(i) for i in range(count)))
            transactions = runtime.committer.transactions - before
            assert 1 <= transactions <= count // 2, transactions  # not one per registration
            body = (await client.get("/v1/admin/events", params={"limit": 5000})).json()
            joined = [
                ev["subjects"]["node"] for ev in body["events"] if ev["kind"] == "node.joined"
            ]
            assert sorted(joined) == [f"n{i:03d}" for i in range(count)]

    asyncio.run(go())
    with sqlite3.connect(tmp_path / "c.db") as raw:
        rows = raw.execute("SELECT body FROM events WHERE body LIKE '%node.joined%'").fetchall()
    assert len(rows) == count


def test_events_kept_is_read_from_the_config_and_must_be_positive(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("listen: {port: 8080}\nstore: c.db\n")
    assert load_controller_config(path).events_kept == EVENTS_KEPT == 50_000
    path.write_text("listen: {port: 8080}\nstore: c.db\nevents_kept: 3\n")
    assert load_controller_config(path).events_kept == 3
    for bad in ("0", "'3'"):
        path.write_text(f"listen: {{port: 8080}}\nstore: c.db\nevents_kept: {bad}\n")
        with pytest.raises(ConfigError, match="events_kept"):
            load_controller_config(path)
