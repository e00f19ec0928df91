"""The SQLite store: round trips, reopening, schema versions, and SIGKILL at random points."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.store_batches import batches, replica_row
from llmgw_twin.control.durable import (
    DeleteReplica,
    DurableState,
    PutDeployment,
    PutNode,
    PutProfile,
    PutReplica,
    PutSeq,
    ReplicaRow,
    Write,
)
from llmgw_twin.control.model import (
    Deployment,
    EngineName,
    FabricId,
    ModelName,
    NodeId,
    NodeInfo,
    Profile,
    ProfileName,
    ReplicaId,
    ShardSpec,
    TraceEvent,
)
from llmgw_twin.store.schema import MIGRATIONS, SCHEMA_VERSION
from llmgw_twin.store.sqlite import Store, StoreError

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


# Rows as the store has written them since schema version 1 (canonical JSON: sorted keys, no
# spaces), literally; the second spec predates `rank_ports`.
SPEC_0 = (
    '{"args":["--x"],"engine":"vllm","gpus":[0,1],"leader":"n1","load_time_ms":1500,'
    '"model":"m","model_path":"/models/m","node":"n1","nodes":["n1","n2"],"profile":"p",'
    '"rank":0,"rank_ports":[29500,29502],"rendezvous_port":29500,"replica":"m-r1",'
    '"shard_count":2}'
)
SPEC_1_OLD = (
    '{"args":[],"engine":"vllm","gpus":[2,3],"leader":"n1","load_time_ms":0,"model":"m",'
    '"model_path":"/models/m","node":"n2","nodes":["n1","n2"],"profile":"p","rank":1,'
    '"rendezvous_port":29500,"replica":"m-r1","shard_count":2}'
)
TODAYS_ROWS: dict[str, list[tuple[object, ...]]] = {
    "profiles": [
        (
            "p",
            '{"args":["--a"],"engine":"vllm","gpus_per_node":2,"load_time_ms":20000,'
            '"model":"/models/m","name":"p","nodes":2}',
        )
    ],
    "deployments": [("m", '{"model":"m","profile":"p","replicas":3}')],
    "nodes": [
        (
            "n1",
            '{"engines":["sim","vllm"],"fabric":"ib-a","gpu_memory_mib":81920,"gpus":8,'
            '"node":"n1"}',
        ),
        ("n2", '{"engines":[],"fabric":"ib-a","gpu_memory_mib":0,"gpus":4,"node":"n2"}'),
    ],
    "replicas": [
        (
            "m-r1",
            "m",
            '{"created_ms":10,"fabric":"ib-a","id":"m-r1","model":"m","profile":"p","seq":1,'
            f'"shard_count":2,"specs":[{SPEC_0},{SPEC_1_OLD}]}}',
        )
    ],
    "seqs": [("m", 1)],
}


def todays_state() -> DurableState:
    n1, n2 = NodeId("n1"), NodeId("n2")
    spec = ShardSpec(
        ReplicaId("m-r1"),
        ModelName("m"),
        ProfileName("p"),
        EngineName("vllm"),
        "/models/m",
        0,
        2,
        n1,
        (0, 1),
        n1,
        (n1, n2),
        29500,
        (29500, 29502),
        1500,
        ("--x",),
    )
    old = replace(spec, rank=1, node=n2, gpus=(2, 3), rank_ports=(), load_time_ms=0, args=())
    return DurableState(
        profiles=(
            Profile(ProfileName("p"), EngineName("vllm"), 2, 2, "/models/m", 20_000, ("--a",)),
        ),
        deployments=(Deployment(ModelName("m"), ProfileName("p"), 3),),
        nodes=(
            NodeInfo(n1, FabricId("ib-a"), 8, 81920, (EngineName("sim"), EngineName("vllm"))),
            NodeInfo(n2, FabricId("ib-a"), 4, 0, ()),
        ),
        replicas=(
            ReplicaRow(
                ReplicaId("m-r1"),
                ModelName("m"),
                ProfileName("p"),
                1,
                10,
                FabricId("ib-a"),
                2,
                (spec, old),
            ),
        ),
        seqs=((ModelName("m"), 1),),
    )


def write_raw(path: Path, version: int, rows: dict[str, list[tuple[object, ...]]]) -> None:
    """A store as an earlier controller left it: its schema up to `version`, these rows."""
    raw = sqlite3.connect(path)
    for migration in MIGRATIONS[:version]:
        for statement in migration.split(";"):
            if statement.strip():
                raw.execute(statement)
    for table, values in rows.items():
        for row in values:
            marks = ", ".join("?" * len(row))
            raw.execute(f"INSERT INTO {table} VALUES ({marks})", row)  # noqa: S608
    raw.execute(f"PRAGMA user_version = {version}")
    raw.commit()
    raw.close()


@pytest.mark.parametrize("version", [1, 2])
def test_a_store_written_in_todays_row_format_loads_the_same_state(
    tmp_path: Path, version: int
) -> None:
    path = tmp_path / "c.db"
    write_raw(path, version, TODAYS_ROWS)
    expected = todays_state()
    with Store(str(path)) as store:
        assert store.version == SCHEMA_VERSION
        assert store.load() == expected
    # written again, each row is the same bytes (the old spec gains today's empty `rank_ports`,
    # the profile today's `start_timeout_ms` of 0)
    again = tmp_path / "again.db"
    with Store(str(again)) as store:
        store.commit(
            [PutProfile(x) for x in expected.profiles]
            + [PutDeployment(x) for x in expected.deployments]
            + [PutNode(x) for x in expected.nodes]
            + [PutReplica(x) for x in expected.replicas]
            + [PutSeq(m, s) for m, s in expected.seqs]
        )
    spec_1 = SPEC_1_OLD.replace('"rank":1,', '"rank":1,"rank_ports":[],')
    ((rid, model, body),) = TODAYS_ROWS["replicas"]
    ((pname, pbody),) = TODAYS_ROWS["profiles"]
    # (and today's topology: none for a node, no rules for a profile)
    profile_row = (
        pname,
        str(pbody).replace(
            '"nodes":2}',
            '"nodes":2,"start_timeout_ms":0,"topology":{"leaves":"any","nvlink":"any"}}',
        ),
    )
    node_rows = [
        (name, str(row).replace(f'"node":"{name}"}}', f'"node":"{name}","topology":null}}'))
        for name, row in TODAYS_ROWS["nodes"]
    ]
    # (and today's role groups: none for a deployment, a replica, a spec)
    replica_body = (
        str(body)
        .replace(SPEC_1_OLD, spec_1)
        .replace('"fabric":"ib-a",', '"fabric":"ib-a","group":"",')
        .replace('"replica":"m-r1",', '"replica":"m-r1","role":"",')
    )
    ((model_key, dbody),) = TODAYS_ROWS["deployments"]
    rewritten = TODAYS_ROWS | {
        "replicas": [(rid, model, replica_body)],
        "profiles": [profile_row],
        "nodes": node_rows,
        "deployments": [
            (model_key, str(dbody).replace('"replicas":3}', '"replicas":3,"roles":[]}'))
        ],
    }
    raw = sqlite3.connect(again)
    for table, rows in rewritten.items():
        query = f"SELECT * FROM {table} ORDER BY 1"  # noqa: S608
        assert raw.execute(query).fetchall() == rows
    raw.close()


@pytest.mark.parametrize(
    ("table", "row", "says"),
    [
        (
            "nodes",
            ("n9", '{"engines":[],"fabric":"f","gpu_memory_mib":0,"gpus":"8","node":"n9"}'),
            "gpus: Expected `int`, got `str`",
        ),
        ("deployments", ("m9", '{"model":"m9","profile":"p"}'), "replicas: required field missing"),
        ("profiles", ("p9", "{not json"), "invalid JSON"),
    ],
)
def test_a_row_that_does_not_decode_is_a_store_error_naming_its_table_and_key(
    tmp_path: Path, table: str, row: tuple[str, str], says: str
) -> None:
    path = tmp_path / "c.db"
    write_raw(path, SCHEMA_VERSION, {table: [row]})
    with Store(str(path)) as store, pytest.raises(StoreError) as err:
        store.load()
    assert f"{table} row {row[0]!r}" in str(err.value) and says in str(err.value)


def event(i: int) -> TraceEvent:
    """Event `i`: scalar subjects of each kind and a tuple one, as the core emits them."""
    return TraceEvent.of(
        1_000 + i,
        "shard.started",
        replica=f"m-r{i}",
        rank=i % 3,
        ready=i % 2 == 0,
        argv=("sim", "--port", str(i)),
    )


def event_rows(path: Path) -> list[int]:
    raw = sqlite3.connect(path)
    try:
        return [int(seq) for (seq,) in raw.execute("SELECT seq FROM events ORDER BY seq")]
    finally:
        raw.close()


def test_events_are_numbered_on_across_reopens_and_only_the_newest_are_kept(
    tmp_path: Path,
) -> None:
    path = tmp_path / "c.db"
    with Store(str(path), events_kept=5) as store:
        assert store.load_events() == (0, [])
        store.commit(every_record()[:1], [event(0), event(1)])
        assert store.load_events() == (0, [event(0), event(1)])
        store.commit([], [event(i) for i in range(2, 9)])  # events alone are a commit too
        assert event_rows(path) == [4, 5, 6, 7, 8]  # pruned in the same commit
        store.commit(every_record()[1:2])  # a commit without events leaves the log alone
        assert event_rows(path) == [4, 5, 6, 7, 8]
    with Store(str(path), events_kept=5) as store:
        assert store.load_events() == (4, [event(i) for i in range(4, 9)])
        store.commit([], [event(9)])
        assert event_rows(path) == [5, 6, 7, 8, 9]
        assert store.load().deployments == (Deployment(ModelName("m"), ProfileName("p"), 3),)
    # a smaller bound reads the newest of them; a larger one all there are
    with Store(str(path), events_kept=2) as store:
        assert store.load_events() == (8, [event(8), event(9)])
        store.commit([], [event(10)])
        assert event_rows(path) == [9, 10]
    with Store(str(path), events_kept=100) as store:
        assert store.load_events() == (9, [event(9), event(10)])
        store.commit([], [event(11)])
        assert store.load_events() == (9, [event(9), event(10), event(11)])


def test_a_failed_commit_appends_no_event_and_uses_up_no_number(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    with Store(str(path)) as store:
        store.commit([], [event(0)])
        bad: list[Write] = [every_record()[0], "not a write"]  # type: ignore[list-item]
        with pytest.raises(AssertionError):
            store.commit(bad, [event(1), event(2)])
        assert store.load_events() == (0, [event(0)])
        store.commit([], [event(3)])
        assert store.load_events() == (0, [event(0), event(3)])
        assert store.load().profiles == ()


def test_a_version_4_store_takes_the_event_log_migration_and_keeps_its_state(
    tmp_path: Path,
) -> None:
    path = tmp_path / "c.db"
    write_raw(path, 4, TODAYS_ROWS)
    with Store(str(path)) as store:
        assert store.version == SCHEMA_VERSION
        assert store.load() == todays_state()
        assert store.load_events() == (0, [])
        store.commit([], [event(0)])
    with Store(str(path)) as store:
        assert store.load_events() == (0, [event(0)])


def test_an_event_row_that_does_not_decode_is_a_store_error_naming_its_number(
    tmp_path: Path,
) -> None:
    path = tmp_path / "c.db"
    write_raw(path, SCHEMA_VERSION, {"events": [(0, '{"kind":"x","subjects":{},"t_ms":"1"}')]})
    with Store(str(path)) as store, pytest.raises(StoreError, match="events row 0"):
        store.load_events()
