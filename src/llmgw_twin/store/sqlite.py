"""The controller's durable state in SQLite (stdlib `sqlite3`): one transaction per decision.

`Store.commit(writes)` applies one step's writes in a single transaction, so a controller killed
at any instant leaves either all of a decision or none of it; a commit that returned is on disk
(WAL journal, `synchronous=FULL`). `Store.load()` reads the whole `DurableState` back. A row's
body is its record's canonical JSON (`codec.dumps`: sorted keys), so the same state is the same
bytes; it is read back with `codec.loads`, where a field the row predates takes the dataclass
default, and a row that does not decode is a `StoreError` naming its table and key.

The schema carries a version (`PRAGMA user_version`; the migrations are `schema.py`'s);
opening a store runs every migration it lacks, in order, each in its own transaction, and
refuses a store newer than this code. How writes and events become rows is `rows.py`.

The leader lease lives here too (`claim_lease`, `renew_lease`, `control.lease`): with `epoch`,
a commit lands only while the lease is still in that epoch (`Fenced` otherwise).

The controller service's event log rides in the same transactions: `commit(writes, events)`
appends the events, numbered on from the newest kept (a number is never used twice), and drops
all but the newest `events_kept` in that same transaction; `load_events()` reads them back.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from llmgw_twin import codec
from llmgw_twin.control.durable import (
    DurableState,
    QuarantineRow,
    ReplicaRow,
    Write,
)
from llmgw_twin.control.lease import Lease, claim, renew
from llmgw_twin.control.model import (
    Deployment,
    ModelName,
    NodeId,
    NodeInfo,
    Profile,
    ProfileName,
    TraceEvent,
)
from llmgw_twin.store.rows import apply_write, event_of, event_text, times_of
from llmgw_twin.store.schema import MIGRATIONS, SCHEMA_VERSION

EVENTS_KEPT = 50_000
"""How many of the newest events a store keeps, unless told otherwise."""

R = TypeVar("R")


class StoreError(Exception):
    pass


class Fenced(StoreError):
    """A commit or renewal in an epoch the store no longer holds: its controller was deposed."""


class Store:
    """A controller's store; `path=":memory:"` for a run that needs no file (the twin)."""

    def __init__(self, path: str, *, events_kept: int = EVENTS_KEPT) -> None:
        if events_kept < 1:
            raise ValueError(f"events_kept must be at least 1, got {events_kept}")
        self.path = path
        self.events_kept = events_kept
        # transactions are explicit; the controller commits from a worker thread, one use at a
        # time (`service.committer`), so the connection may be used from another thread
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._migrate()
        newest = self._db.execute("SELECT MAX(seq) FROM events").fetchone()[0]
        self._next_event = 0 if newest is None else int(newest) + 1
        """The number the next event appended gets."""

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

    def commit(
        self, writes: Iterable[Write], events: Sequence[TraceEvent] = (), epoch: int | None = None
    ) -> None:
        """Apply one decision's writes atomically, and append `events` to the event log in the
        same transaction (numbered on from the last, the oldest beyond `events_kept` dropped);
        returns once they are durable. With `epoch`, only while the lease is in that epoch
        (else `Fenced`, and nothing is written): a deposed leader's decision never lands."""
        batch = list(writes)
        if not batch and not events and epoch is None:
            return
        db = self._db
        first, end = self._next_event, self._next_event + len(events)
        db.execute("BEGIN IMMEDIATE")
        try:
            held = self._lease_row() if epoch is not None else None
            if epoch is not None and (held is None or held.epoch != epoch):
                raise Fenced(f"{self.path}: the lease is no longer in epoch {epoch}")
            if events:
                db.executemany(
                    "INSERT INTO events VALUES (?, ?)",
                    ((first + i, event_text(ev)) for i, ev in enumerate(events)),
                )
                db.execute("DELETE FROM events WHERE seq < ?", (end - self.events_kept,))
            for w in batch:
                apply_write(db, w)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self._next_event = end

    # --- the leader lease (`control.lease`): the caller gives the store's time --------------

    def lease(self) -> Lease | None:
        return self._lease_row()

    def claim_lease(self, who: str, now_ms: int, lease_ms: int) -> Lease | None:
        """Lead from now, in a new epoch, if the lease is free (`lease.claim`)."""
        return self._lease_change(lambda cur: claim(cur, who, now_ms, lease_ms))

    def renew_lease(self, who: str, epoch: int, now_ms: int, lease_ms: int) -> Lease:
        """Extend the lease of the leader in `epoch`; `Fenced` if it was deposed."""
        got = self._lease_change(lambda cur: renew(cur, who, epoch, now_ms, lease_ms))
        if got is None:
            raise Fenced(f"{self.path}: {who} no longer holds the lease in epoch {epoch}")
        return got

    def _lease_row(self) -> Lease | None:
        row = self._db.execute("SELECT holder, epoch, expires_ms FROM lease").fetchone()
        return None if row is None else Lease(str(row[0]), int(row[1]), int(row[2]))

    def _lease_change(self, decide: Callable[[Lease | None], Lease | None]) -> Lease | None:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            new = decide(self._lease_row())
            if new is not None:
                db.execute(
                    "INSERT OR REPLACE INTO lease VALUES (0, ?, ?, ?)",
                    (new.holder, new.epoch, new.expires_ms),
                )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return new

    def load_events(self) -> tuple[int, list[TraceEvent]]:
        """The number of the oldest event kept (of the next one, when none is) and the newest
        `events_kept` events, oldest first, numbered on from it."""
        query = "SELECT seq, body FROM events WHERE seq >= ? ORDER BY seq"
        rows = self._db.execute(query, (self._next_event - self.events_kept,)).fetchall()
        first = int(rows[0][0]) if rows else self._next_event
        out: list[TraceEvent] = []
        for seq, body in rows:
            if seq != first + len(out):
                raise StoreError(f"{self.path}: events: event {first + len(out)} is missing")
            try:
                out.append(event_of(body))
            except (ValueError, TypeError) as err:
                raise StoreError(f"{self.path}: events row {seq}: {err}") from err
        return first, out

    def put_agent_url(self, node: NodeId, url: str) -> None:
        """Remember where a node's agent listens, so a restarted controller can reach it."""
        self._write("INSERT OR REPLACE INTO agent_urls VALUES (?, ?)", (node, url))

    def put_credential(self, node: str, token_sha256: str, agent_url: str, issued_ms: int) -> None:
        """Bind a node's credential (replacing the one it had: rotation), durably."""
        self._write(
            "INSERT OR REPLACE INTO node_credentials VALUES (?, ?, ?, ?)",
            (node, token_sha256, agent_url, issued_ms),
        )

    def delete_credential(self, node: str) -> None:
        self._write("DELETE FROM node_credentials WHERE node = ?", (node,))

    def credentials(self) -> list[tuple[str, str, str, int]]:
        """(node, token_sha256, agent_url, issued_ms) of every node credential, by node."""
        rows = self._db.execute(
            "SELECT node, token_sha256, agent_url, issued_ms FROM node_credentials ORDER BY node"
        ).fetchall()
        return [(str(n), str(h), str(u), int(t)) for n, h, u, t in rows]

    def _write(self, statement: str, values: tuple[object, ...]) -> None:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._db.execute(statement, values)
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def agent_urls(self) -> dict[NodeId, str]:
        rows = self._db.execute("SELECT node, url FROM agent_urls ORDER BY node").fetchall()
        return {NodeId(n): str(u) for n, u in rows}

    def load(self) -> DurableState:
        db = self._db

        def rows(cls: type[R], table: str, key: str) -> tuple[R, ...]:
            query = f"SELECT {key}, body FROM {table} ORDER BY {key}"  # noqa: S608
            out: list[R] = []
            for k, body in db.execute(query).fetchall():
                try:
                    out.append(codec.loads(cls, body))
                except codec.CodecError as err:
                    raise StoreError(f"{self.path}: {table} row {k!r}: {err}") from err
            return tuple(out)

        seqs = tuple(
            (ModelName(m), int(s))
            for m, s in db.execute("SELECT model, seq FROM seqs ORDER BY model").fetchall()
        )
        failed = tuple(
            (NodeId(n), int(g))
            for n, g in db.execute("SELECT node, gpu FROM failed_gpus ORDER BY node, gpu")
        )
        silent = tuple(
            (NodeId(n), int(t))
            for n, t in db.execute("SELECT node, since_ms FROM silence ORDER BY node")
        )
        clock = db.execute("SELECT now_ms FROM clock WHERE id = 0").fetchone()
        quarantines: list[QuarantineRow] = []
        for n, p, body in db.execute(
            "SELECT node, profile, body FROM quarantines ORDER BY node, profile"
        ):
            try:
                quarantines.append(codec.loads(QuarantineRow, body))
            except codec.CodecError as err:
                raise StoreError(f"{self.path}: quarantines row {n!r}/{p!r}: {err}") from err
        return DurableState(
            profiles=rows(Profile, "profiles", "name"),
            deployments=rows(Deployment, "deployments", "model"),
            nodes=rows(NodeInfo, "nodes", "node"),
            replicas=rows(ReplicaRow, "replicas", "id"),
            seqs=seqs,
            failed_gpus=failed,
            silent=silent,
            quarantines=tuple(quarantines),
            clock_ms=int(clock[0]) if clock is not None else 0,
            cordons=tuple(
                (NodeId(n), bool(d))
                for n, d in db.execute("SELECT node, draining FROM cordons ORDER BY node")
            ),
            model_failures=tuple(
                (ModelName(m), times_of(t))
                for m, t in db.execute("SELECT model, times FROM model_failures ORDER BY model")
            ),
            node_failures=tuple(
                ((NodeId(n), ProfileName(p)), times_of(t))
                for n, p, t in db.execute(
                    "SELECT node, profile, times FROM node_failures ORDER BY node, profile"
                )
            ),
        )
