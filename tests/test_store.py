"""The SQLite store: round trips, reopening, schema versions, and SIGKILL at random points."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.store_batches import batches, replica_row
from llmgw_twin.core.durable import (
    DeleteReplica,
    DurableState,
    PutDeployment,
    PutNode,
    PutProfile,
    PutReplica,
    PutSeq,
    Write,
)
from llmgw_twin.core.model import (
    Deployment,
    EngineName,
    FabricId,
    ModelName,
    NodeId,
    NodeInfo,
    Profile,
    ProfileName,
)
from llmgw_twin.store import MIGRATIONS, SCHEMA_VERSION, Store, StoreError

TESTS = Path(__file__).resolve().parent


def every_record() -> list[Write]:
    return [
        PutProfile(Profile(ProfileName("p"), EngineName("vllm"), 2, 4, "/m", 20_000, ("--a",))),
        PutDeployment(Deployment(ModelName("m"), ProfileName("p"), 3)),
        PutNode(NodeInfo(NodeId("n1"), FabricId("ib-a"), 8, 81920, (EngineName("sim"),))),
        PutReplica(replica_row(1, ("n1", "n2"), (0, 1, 2, 3))),
        PutSeq(ModelName("m"), 7),
    ]


def test_every_record_round_trips_through_a_reopen(tmp_path: Path) -> None:
    path = str(tmp_path / "c.db")
    writes = every_record()
    with Store(path) as store:
        store.commit(writes)
        before = store.load()
    assert before == DurableState().apply(writes)
    assert before.replicas[0].specs[1].nodes == ("n1", "n2")
    with Store(path) as store:
        assert store.load() == before
        assert store.version == SCHEMA_VERSION


def test_delete_and_overwrite(tmp_path: Path) -> None:
    with Store(str(tmp_path / "c.db")) as store:
        store.commit(every_record())
        row = replica_row(1, ("n1", "n2"), (0, 1, 2, 3))
        store.commit(
            [DeleteReplica(row.id), PutDeployment(Deployment(ModelName("m"), ProfileName("p"), 0))]
        )
        state = store.load()
    assert state.replicas == ()
    assert state.deployments[0].replicas == 0


def test_a_failed_batch_leaves_nothing_behind(tmp_path: Path) -> None:
    with Store(str(tmp_path / "c.db")) as store:
        store.commit(every_record()[:1])
        bad: list[Write] = [every_record()[1], "not a write"]  # type: ignore[list-item]
        store._db.execute(
            "CREATE TRIGGER no_seq BEFORE INSERT ON seqs BEGIN SELECT RAISE(ABORT, 'x'); END"
        )
        with pytest.raises(sqlite3.IntegrityError):
            store.commit([every_record()[1], PutSeq(ModelName("m"), 1)])
        assert store.load().deployments == ()  # the deployment of the torn batch is not there
        del bad


def test_a_newer_schema_is_refused_and_an_empty_file_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == 0
    raw.close()
    with Store(str(path)) as store:
        assert store.version == SCHEMA_VERSION
    raw = sqlite3.connect(path)
    raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    raw.close()
    with pytest.raises(StoreError, match="newer than this controller"):
        Store(str(path))


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=0, max_value=10_000), st.integers(min_value=1, max_value=30))
def test_state_after_any_sequence_and_a_reopen_equals_the_state_before(
    tmp_path_factory: pytest.TempPathFactory, seed: int, count: int
) -> None:
    path = str(tmp_path_factory.mktemp("prop") / "c.db")
    expected = DurableState()
    with Store(path) as store:
        for batch in batches(seed, count):
            store.commit(batch)
            expected = expected.apply(batch)
        assert store.load() == expected
    with Store(path) as store:
        assert store.load() == expected


def prefixes(seed: int, count: int) -> list[DurableState]:
    """prefixes[j]: the state after the first j batches."""
    out = [DurableState()]
    for batch in batches(seed, count):
        out.append(out[-1].apply(batch))
    return out


def test_sigkill_at_random_points_loses_no_acknowledged_batch(tmp_path: Path) -> None:
    count = 400
    rng = random.Random(20261129)
    states = prefixes(7, count)
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    for attempt in range(8):  # bounded: eight kills
        path = tmp_path / f"crash{attempt}.db"
        kill_after = rng.randrange(count - 1)
        proc = subprocess.Popen(
            [
                sys.executable,
                str(TESTS / "helpers" / "store_writer.py"),
                str(path),
                "7",
                str(count),
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert proc.stdout is not None
        acked = -1
        try:
            for line in proc.stdout:
                acked = int(line.split()[1])
                if acked >= kill_after:
                    proc.send_signal(signal.SIGKILL)
                    break
        finally:
            proc.kill()
            proc.wait(timeout=30)
        assert acked == kill_after, "the writer ended before the chosen kill point"
        with Store(str(path)) as store:
            assert store._db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            state = store.load()
        committed = [j for j in range(acked + 1, count + 1) if states[j] == state]
        assert committed, f"attempt {attempt}: store is not any prefix at or after ack {acked}"


def test_agent_urls_survive_a_reopen_and_migrating_a_version_1_store_keeps_its_data(
    tmp_path: Path,
) -> None:
    path = tmp_path / "c.db"
    raw = sqlite3.connect(path)  # a store written by version 1 of the schema
    for statement in MIGRATIONS[0].split(";"):
        if statement.strip():
            raw.execute(statement)
    raw.execute("INSERT INTO seqs VALUES ('m', 4)")
    raw.execute("PRAGMA user_version = 1")
    raw.commit()
    raw.close()
    with Store(str(path)) as store:
        assert store.version == SCHEMA_VERSION
        assert store.load().seqs == ((ModelName("m"), 4),)
        store.put_agent_url(NodeId("n1"), "http://127.0.0.1:9001")
    with Store(str(path)) as store:
        assert store.agent_urls() == {"n1": "http://127.0.0.1:9001"}
