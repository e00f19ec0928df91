"""The PostgreSQL store against a real server (one throwaway server for the module, a fresh
database per test): the same state as the SQLite store for the same writes, the lease and
fencing between two connections as two controllers hold them, the event log numbered on across
a change of leader, and two controller services failing over on it."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from helpers.postgres import fresh_database, postgres_server
from helpers.services import FAST
from helpers.store_batches import batches
from llmgw_twin.control.durable import PutClock, PutSeq
from llmgw_twin.control.model import EngineName, ModelName, Profile, ProfileName, TraceEvent
from llmgw_twin.control.protocol import ApplyProfile
from llmgw_twin.service.controller.app import ControllerRuntime
from llmgw_twin.service.controller.config import ControllerSettings
from llmgw_twin.store.base import Fenced
from llmgw_twin.store.choose import open_store
from llmgw_twin.store.postgres import PgStore
from llmgw_twin.store.schema import SCHEMA_VERSION
from llmgw_twin.store.sqlite import Store

_names = itertools.count()


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with postgres_server() as url:
        yield url


@pytest.fixture
def url(server: str) -> str:
    return fresh_database(server, f"t{next(_names)}")


def test_a_url_opens_postgres_and_a_path_sqlite(url: str, tmp_path: Path) -> None:
    with open_store(url) as pg, open_store(str(tmp_path / "s.db")) as lite:
        assert isinstance(pg, PgStore) and isinstance(lite, Store)
        assert pg.version == SCHEMA_VERSION


@pytest.mark.parametrize("seed", range(6))
def test_the_same_writes_give_the_same_state_as_sqlite(
    server: str, tmp_path: Path, seed: int
) -> None:
    pg_url = fresh_database(server, f"h{next(_names)}")
    with PgStore(pg_url) as pg, Store(str(tmp_path / "s.db")) as lite:
        for writes in batches(seed, 40):
            pg.commit(writes)
            lite.commit(writes)
            assert pg.load() == lite.load()


def test_two_controllers_share_the_lease_and_the_deposed_one_is_fenced(url: str) -> None:
    with PgStore(url) as first, PgStore(url) as second:
        now = first.now_ms()
        assert abs(now - second.now_ms()) < 60_000  # one clock: the server's
        one = first.claim_lease("c1", now, 15_000)
        assert one is not None and one.epoch == 1
        assert second.claim_lease("c2", now + 1, 15_000) is None  # live: c1 keeps it
        first.commit([PutSeq(ModelName("m"), 1)], epoch=1)
        first.commit([PutClock(5)], epoch=1)  # a quiet leader's lone write: one statement
        two = second.claim_lease("c2", now + 15_000, 15_000)
        assert two is not None and two.epoch == 2
        with pytest.raises(Fenced):
            first.commit([PutSeq(ModelName("m"), 7)], epoch=1)
        with pytest.raises(Fenced):
            first.commit([PutClock(9)], epoch=1)
        with pytest.raises(Fenced):
            first.renew_lease("c1", 1, now + 15_001, 15_000)
        second.commit([PutSeq(ModelName("m"), 2)], epoch=2)
        assert dict(first.load().seqs) == {ModelName("m"): 2}
        assert first.load().clock_ms == 5
        second.commit([PutClock(7)], epoch=2)
        assert first.load().clock_ms == 7


def test_the_event_log_numbers_on_across_a_change_of_leader(url: str) -> None:
    def event(i: int) -> TraceEvent:
        return TraceEvent.of(i, "node.joined", node=f"n{i}")

    with PgStore(url, events_kept=3) as first, PgStore(url, events_kept=3) as second:
        first.commit([], [event(0), event(1)])
        second.commit([], [event(2), event(3)])  # a new leader: numbers go on, none reused
        oldest, events = first.load_events()
        assert oldest == 1 and [e.t_ms for e in events] == [1, 2, 3]


def test_a_standby_service_takes_over_on_postgres(url: str) -> None:
    # long enough that a leader renewing every fifth of it keeps it on a starved machine (two
    # test workers and a build beside them): the standby must wait, then take over
    lease = replace(FAST, lease_ms=4_000)
    deaths: list[str] = []

    def runtime(name: str) -> ControllerRuntime:
        def agent(request: httpx.Request) -> httpx.Response:
            return httpx.Response(200, json={"ok": True})

        def fatal(message: str) -> None:
            deaths.append(message)
            raise RuntimeError(message)

        s = ControllerSettings("127.0.0.1", 0, url, lease, (), (), name=name)
        return ControllerRuntime(s, agent_transport=httpx.MockTransport(agent), fatal=fatal)

    async def go() -> None:
        first = runtime("c1")
        await first.start()
        second = runtime("c2")
        standby = asyncio.create_task(second.start())
        await asyncio.sleep(lease.lease_ms / 1000 / 2)
        assert not standby.done()
        await first.leadership.stop()  # c1 freezes
        await asyncio.wait_for(standby, timeout=30)
        assert second.leadership.epoch == 2
        profile = Profile(ProfileName("p"), EngineName("sim"), 1, 1, "/models/p")
        done = first._apply(first.core.handle(ApplyProfile(profile), first.now_ms()))
        assert done is not None
        with pytest.raises(RuntimeError):
            await done
        assert any("epoch 1" in d for d in deaths)
        assert second.store.load().profiles == ()
        await second.stop()
        await first.stop()

    asyncio.run(go())


def test_a_bad_url_is_a_store_error_without_the_password() -> None:
    from llmgw_twin.store.base import StoreError

    with pytest.raises(StoreError) as err:
        PgStore("postgresql://admin:hunter2@/nope?host=/nonexistent-socket-dir")
    assert "hunter2" not in str(err.value) and "admin:***@" in str(err.value)
