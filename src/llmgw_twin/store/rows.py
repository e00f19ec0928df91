"""How each durable write and each event becomes rows of the store, and back.

A row's body is its record's canonical JSON (`codec.dumps`: sorted keys), so the same state is
the same bytes. `apply_write` runs inside the caller's transaction.
"""

from __future__ import annotations

import json
import sqlite3
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


def apply_write(db: sqlite3.Connection, w: Write) -> None:
    """One durable write, inside the caller's transaction."""
    match w:
        case PutProfile(profile=p):
            db.execute(
                "INSERT OR REPLACE INTO profiles VALUES (?, ?)",
                (p.name, codec.dumps(p)),
            )
        case PutDeployment(deployment=d):
            db.execute(
                "INSERT OR REPLACE INTO deployments VALUES (?, ?)",
                (d.model, codec.dumps(d)),
            )
        case PutNode(info=n):
            db.execute(
                "INSERT OR REPLACE INTO nodes VALUES (?, ?)",
                (n.node, codec.dumps(n)),
            )
        case DeleteNode(node=gone):
            for table in ("nodes", "failed_gpus", "silence", "quarantines", "node_failures"):
                db.execute(f"DELETE FROM {table} WHERE node = ?", (gone,))  # noqa: S608
        case PutReplica(row=r):
            db.execute(
                "INSERT OR REPLACE INTO replicas VALUES (?, ?, ?)",
                (r.id, r.model, codec.dumps(r)),
            )
        case DeleteReplica(replica=rid):
            db.execute("DELETE FROM replicas WHERE id = ?", (rid,))
        case PutSeq(model=m, seq=s):
            db.execute("INSERT OR REPLACE INTO seqs VALUES (?, ?)", (m, s))
        case PutFailedGpu(node=n, gpu=g):
            db.execute("INSERT OR REPLACE INTO failed_gpus VALUES (?, ?)", (n, g))
        case DeleteFailedGpu(node=n, gpu=g):
            db.execute("DELETE FROM failed_gpus WHERE node = ? AND gpu = ?", (n, g))
        case PutSilence(node=n, since_ms=since):
            db.execute("INSERT OR REPLACE INTO silence VALUES (?, ?)", (n, since))
        case DeleteSilence(node=n):
            db.execute("DELETE FROM silence WHERE node = ?", (n,))
        case PutQuarantine(row=q):
            db.execute(
                "INSERT OR REPLACE INTO quarantines VALUES (?, ?, ?)",
                (q.node, q.profile, codec.dumps(q)),
            )
        case DeleteQuarantine(node=n, profile=p):
            db.execute("DELETE FROM quarantines WHERE node = ? AND profile = ?", (n, p))
        case PutClock(now_ms=t):
            db.execute("INSERT OR REPLACE INTO clock VALUES (0, ?)", (t,))
        case PutModelFailures(model=m, times_ms=times):
            db.execute("DELETE FROM model_failures WHERE model = ?", (m,))
            if times:
                db.execute("INSERT INTO model_failures VALUES (?, ?)", (m, json.dumps(times)))
        case PutNodeFailures(node=n, profile=p, times_ms=times):
            db.execute("DELETE FROM node_failures WHERE node = ? AND profile = ?", (n, p))
            if times:
                db.execute("INSERT INTO node_failures VALUES (?, ?, ?)", (n, p, json.dumps(times)))
        case DeleteDeployment(model=m):
            db.execute("DELETE FROM deployments WHERE model = ?", (m,))
        case PutCordon(node=n, draining=draining):
            db.execute("INSERT OR REPLACE INTO cordons VALUES (?, ?)", (n, draining))
        case DeleteCordon(node=n):
            db.execute("DELETE FROM cordons WHERE node = ?", (n,))
        case _:
            assert_never(w)
