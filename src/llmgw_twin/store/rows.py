"""How each durable write and each event becomes rows of the store, and back.

A row's body is its record's canonical JSON (`codec.dumps`: sorted keys), so the same state is
the same bytes. `apply_write` runs inside the caller's transaction.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from typing import assert_never

from llmgw_twin import codec
from llmgw_twin.control.durable import (
    DeleteCordon,
    DeleteDeployment,
    DeleteFailedGpu,
    DeleteNode,
    DeleteQuarantine,
    DeleteReplica,
    DeleteSilence,
    PutClock,
    PutCordon,
    PutDeployment,
    PutFailedGpu,
    PutModelFailures,
    PutNode,
    PutNodeFailures,
    PutProfile,
    PutQuarantine,
    PutReplica,
    PutSeq,
    PutSilence,
    Write,
)
from llmgw_twin.control.model import TraceEvent


def times_of(text: str) -> tuple[int, ...]:
    return tuple(int(t) for t in json.loads(text))


def event_text(ev: TraceEvent) -> str:
    """An event as canonical JSON: `{"kind", "subjects": {name: value}, "t_ms"}`, a tuple value
    as a list (subjects are scalars and flat tuples of them)."""
    subjects = {k: list(v) if isinstance(v, tuple) else v for k, v in ev.subjects}
    body = {"t_ms": ev.t_ms, "kind": ev.kind, "subjects": subjects}
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def event_of(text: str) -> TraceEvent:
    """`event_text` read back: the same event (a list value is a tuple again)."""
    body = json.loads(text)
    if not isinstance(body, dict):
        raise ValueError("not an event object")
    t_ms, kind, subjects = body.get("t_ms"), body.get("kind"), body.get("subjects")
    if type(t_ms) is not int or not isinstance(kind, str) or not isinstance(subjects, dict):
        raise ValueError("expected t_ms (an integer), kind (a string) and subjects (an object)")
    pairs = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in subjects.items()))
    return TraceEvent(t_ms, kind, pairs)


Execute = Callable[[str, Sequence[object]], object]
"""Runs one statement with `?` placeholders (the store's dialect turns them into its own)."""

COLUMNS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "profiles": (("name",), ("body",)),
    "deployments": (("model",), ("body",)),
    "nodes": (("node",), ("body",)),
    "replicas": (("id",), ("model", "body")),
    "seqs": (("model",), ("seq",)),
    "agent_urls": (("node",), ("url",)),
    "failed_gpus": (("node", "gpu"), ()),
    "quarantines": (("node", "profile"), ("body",)),
    "silence": (("node",), ("since_ms",)),
    "clock": (("id",), ("now_ms",)),
    "node_credentials": (("node",), ("token_sha256", "agent_url", "issued_ms")),
    "cordons": (("node",), ("draining",)),
    "lease": (("id",), ("holder", "epoch", "expires_ms")),
    "model_failures": (("model",), ("times",)),
    "node_failures": (("node", "profile"), ("times",)),
    "controllers": (("name",), ("url", "seen_ms")),
}
"""Each table's key columns and other columns, in the order of its row (`schema.py`)."""


def upsert(execute: Execute, table: str, row: Sequence[object]) -> None:
    """Insert `row`, or replace the one with its key: the standard upsert both dialects read."""
    execute(_upsert_sql(table, len(row)), tuple(row))


@functools.cache
def _upsert_sql(table: str, width: int) -> str:
    keys, rest = COLUMNS[table]
    marks = ", ".join("?" for _ in range(width))
    update = ", ".join(f"{c} = excluded.{c}" for c in rest)
    action = f"DO UPDATE SET {update}" if rest else "DO NOTHING"
    return f"INSERT INTO {table} VALUES ({marks}) ON CONFLICT ({', '.join(keys)}) {action}"  # noqa: S608


def apply_write(db: Execute, w: Write) -> None:
    """One durable write, inside the caller's transaction."""
    match w:
        case PutProfile(profile=p):
            upsert(db, "profiles", (p.name, codec.dumps(p)))
        case PutDeployment(deployment=d):
            upsert(db, "deployments", (d.model, codec.dumps(d)))
        case PutNode(info=n):
            upsert(db, "nodes", (n.node, codec.dumps(n)))
        case DeleteNode(node=gone):
            for table in ("nodes", "failed_gpus", "silence", "quarantines", "node_failures"):
                db(f"DELETE FROM {table} WHERE node = ?", (gone,))  # noqa: S608
        case PutReplica(row=r):
            upsert(db, "replicas", (r.id, r.model, codec.dumps(r)))
        case DeleteReplica(replica=rid):
            db("DELETE FROM replicas WHERE id = ?", (rid,))
        case PutSeq(model=m, seq=s):
            upsert(db, "seqs", (m, s))
        case PutFailedGpu(node=n, gpu=g):
            upsert(db, "failed_gpus", (n, g))
        case DeleteFailedGpu(node=n, gpu=g):
            db("DELETE FROM failed_gpus WHERE node = ? AND gpu = ?", (n, g))
        case PutSilence(node=n, since_ms=since):
            upsert(db, "silence", (n, since))
        case DeleteSilence(node=n):
            db("DELETE FROM silence WHERE node = ?", (n,))
        case PutQuarantine(row=q):
            upsert(db, "quarantines", (q.node, q.profile, codec.dumps(q)))
        case DeleteQuarantine(node=n, profile=p):
            db("DELETE FROM quarantines WHERE node = ? AND profile = ?", (n, p))
        case PutClock(now_ms=t):
            upsert(db, "clock", (0, t))
        case PutModelFailures(model=m, times_ms=times):
            db("DELETE FROM model_failures WHERE model = ?", (m,))
            if times:
                db("INSERT INTO model_failures VALUES (?, ?)", (m, json.dumps(times)))
        case PutNodeFailures(node=n, profile=p, times_ms=times):
            db("DELETE FROM node_failures WHERE node = ? AND profile = ?", (n, p))
            if times:
                db("INSERT INTO node_failures VALUES (?, ?, ?)", (n, p, json.dumps(times)))
        case DeleteDeployment(model=m):
            db("DELETE FROM deployments WHERE model = ?", (m,))
        case PutCordon(node=n, draining=draining):
            upsert(db, "cordons", (n, int(draining)))
        case DeleteCordon(node=n):
            db("DELETE FROM cordons WHERE node = ?", (n,))
        case _:
            assert_never(w)
