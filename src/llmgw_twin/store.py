"""The controller's durable state in SQLite (stdlib `sqlite3`): one transaction per decision.

`Store.commit(writes)` applies one step's writes in a single transaction, so a controller killed
at any instant leaves either all of a decision or none of it; a commit that returned is on disk
(WAL journal, `synchronous=FULL`). `Store.load()` reads the whole `DurableState` back. Rows hold
canonical JSON (sorted keys), so the same state is the same bytes.

The schema carries a version (`PRAGMA user_version`); opening a store runs every migration it
lacks, in order, each in its own transaction, and refuses a store newer than this code.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from typing import Any

from llmgw_twin.core.durable import (
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
from llmgw_twin.core.model import (
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
)

MIGRATIONS: tuple[str, ...] = (
    # 1: desired state, node registry, placed replicas, id counters
    """
    CREATE TABLE profiles (name TEXT PRIMARY KEY, body TEXT NOT NULL);
    CREATE TABLE deployments (model TEXT PRIMARY KEY, body TEXT NOT NULL);
    CREATE TABLE nodes (node TEXT PRIMARY KEY, body TEXT NOT NULL);
    CREATE TABLE replicas (id TEXT PRIMARY KEY, model TEXT NOT NULL, body TEXT NOT NULL);
    CREATE TABLE seqs (model TEXT PRIMARY KEY, seq INTEGER NOT NULL);
    """,
    # 2: where each node's agent listens (the production shell's, not the core's, to keep)
    """
    CREATE TABLE agent_urls (node TEXT PRIMARY KEY, url TEXT NOT NULL);
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


class StoreError(Exception):
    pass


def _dump(obj: dict[str, Any]) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def _spec_out(s: ShardSpec) -> dict[str, Any]:
    return {
        "replica": s.replica,
        "model": s.model,
        "profile": s.profile,
        "engine": s.engine,
        "model_path": s.model_path,
        "rank": s.rank,
        "shard_count": s.shard_count,
        "node": s.node,
        "gpus": list(s.gpus),
        "leader": s.leader,
        "nodes": list(s.nodes),
        "rendezvous_port": s.rendezvous_port,
        "rank_ports": list(s.rank_ports),
        "load_time_ms": s.load_time_ms,
        "args": list(s.args),
    }


def _spec_in(d: dict[str, Any]) -> ShardSpec:
    return ShardSpec(
        replica=ReplicaId(d["replica"]),
        model=ModelName(d["model"]),
        profile=ProfileName(d["profile"]),
        engine=EngineName(d["engine"]),
        model_path=d["model_path"],
        rank=d["rank"],
        shard_count=d["shard_count"],
        node=NodeId(d["node"]),
        gpus=tuple(d["gpus"]),
        leader=NodeId(d["leader"]),
        nodes=tuple(NodeId(n) for n in d["nodes"]),
        rendezvous_port=d["rendezvous_port"],
        rank_ports=tuple(d.get("rank_ports", ())),
        load_time_ms=d["load_time_ms"],
        args=tuple(d["args"]),
    )


def _profile_out(p: Profile) -> dict[str, Any]:
    return {
        "name": p.name,
        "engine": p.engine,
        "nodes": p.nodes,
        "gpus_per_node": p.gpus_per_node,
        "model": p.model,
        "load_time_ms": p.load_time_ms,
        "args": list(p.args),
    }


def _profile_in(d: dict[str, Any]) -> Profile:
    return Profile(
        ProfileName(d["name"]),
        EngineName(d["engine"]),
        d["nodes"],
        d["gpus_per_node"],
        d["model"],
        d["load_time_ms"],
        tuple(d["args"]),
    )


def _node_out(n: NodeInfo) -> dict[str, Any]:
    return {
        "node": n.node,
        "fabric": n.fabric,
        "gpus": n.gpus,
        "gpu_memory_mib": n.gpu_memory_mib,
        "engines": list(n.engines),
    }


def _node_in(d: dict[str, Any]) -> NodeInfo:
    return NodeInfo(
        NodeId(d["node"]),
        FabricId(d["fabric"]),
        d["gpus"],
        d["gpu_memory_mib"],
        tuple(EngineName(e) for e in d["engines"]),
    )


def _replica_out(r: ReplicaRow) -> dict[str, Any]:
    return {
        "id": r.id,
        "model": r.model,
        "profile": r.profile,
        "seq": r.seq,
        "created_ms": r.created_ms,
        "fabric": r.fabric,
        "shard_count": r.shard_count,
        "specs": [_spec_out(s) for s in r.specs],
    }


def _replica_in(d: dict[str, Any]) -> ReplicaRow:
    return ReplicaRow(
        ReplicaId(d["id"]),
        ModelName(d["model"]),
        ProfileName(d["profile"]),
        d["seq"],
        d["created_ms"],
        FabricId(d["fabric"]),
        d["shard_count"],
        tuple(_spec_in(s) for s in d["specs"]),
    )


class Store:
    """A controller's store; `path=":memory:"` for a run that needs no file (the twin)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._db = sqlite3.connect(path, isolation_level=None)  # transactions are explicit
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._migrate()

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def version(self) -> int:
        row = self._db.execute("PRAGMA user_version").fetchone()
        return int(row[0])

    def _migrate(self) -> None:
        have = self.version
        if have > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path}: store schema version {have} is newer than this controller's "
                f"({SCHEMA_VERSION}); upgrade the controller"
            )
        for version in range(have + 1, SCHEMA_VERSION + 1):
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for statement in MIGRATIONS[version - 1].split(";"):
                    if statement.strip():
                        self._db.execute(statement)
                self._db.execute(f"PRAGMA user_version = {version}")
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def commit(self, writes: Iterable[Write]) -> None:
        """Apply one decision's writes atomically; returns once they are durable."""
        batch = list(writes)
        if not batch:
            return
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            for w in batch:
                match w:
                    case PutProfile(profile=p):
                        db.execute(
                            "INSERT OR REPLACE INTO profiles VALUES (?, ?)",
                            (p.name, _dump(_profile_out(p))),
                        )
                    case PutDeployment(deployment=d):
                        body = {"model": d.model, "profile": d.profile, "replicas": d.replicas}
                        db.execute(
                            "INSERT OR REPLACE INTO deployments VALUES (?, ?)",
                            (d.model, _dump(body)),
                        )
                    case PutNode(info=n):
                        db.execute(
                            "INSERT OR REPLACE INTO nodes VALUES (?, ?)",
                            (n.node, _dump(_node_out(n))),
                        )
                    case PutReplica(row=r):
                        db.execute(
                            "INSERT OR REPLACE INTO replicas VALUES (?, ?, ?)",
                            (r.id, r.model, _dump(_replica_out(r))),
                        )
                    case DeleteReplica(replica=rid):
                        db.execute("DELETE FROM replicas WHERE id = ?", (rid,))
                    case PutSeq(model=m, seq=s):
                        db.execute("INSERT OR REPLACE INTO seqs VALUES (?, ?)", (m, s))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def put_agent_url(self, node: NodeId, url: str) -> None:
        """Remember where a node's agent listens, so a restarted controller can reach it."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._db.execute("INSERT OR REPLACE INTO agent_urls VALUES (?, ?)", (node, url))
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def agent_urls(self) -> dict[NodeId, str]:
        rows = self._db.execute("SELECT node, url FROM agent_urls ORDER BY node").fetchall()
        return {NodeId(n): str(u) for n, u in rows}

    def load(self) -> DurableState:
        db = self._db

        def bodies(table: str, key: str) -> list[dict[str, Any]]:
            rows = db.execute(f"SELECT body FROM {table} ORDER BY {key}").fetchall()  # noqa: S608
            return [json.loads(r[0]) for r in rows]

        deployments = tuple(
            Deployment(ModelName(d["model"]), ProfileName(d["profile"]), d["replicas"])
            for d in bodies("deployments", "model")
        )
        seqs = tuple(
            (ModelName(m), int(s))
            for m, s in db.execute("SELECT model, seq FROM seqs ORDER BY model").fetchall()
        )
        return DurableState(
            profiles=tuple(_profile_in(p) for p in bodies("profiles", "name")),
            deployments=deployments,
            nodes=tuple(_node_in(n) for n in bodies("nodes", "node")),
            replicas=tuple(_replica_in(r) for r in bodies("replicas", "id")),
            seqs=seqs,
        )
