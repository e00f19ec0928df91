"""What every store does, over SQL: one transaction per decision, the event log in the same
transactions, the leader lease, conditional commits. `sqlite.Store` and `postgres.PgStore` each
give it a connection and their dialect's few differences (how a transaction starts, how a row is
locked, where the schema version lives, the store's clock).

Statements are written once, with `?` placeholders and standard upserts (`INSERT ... ON
CONFLICT ... DO UPDATE`, which SQLite and PostgreSQL both read); a dialect turns the
placeholders into its own.

Invariants: a commit that returned is durable; with `epoch`, a commit lands only while the
lease is in that epoch, checked in the commit's own transaction with the lease row locked, so a
claim cannot slip between the check and the writes; events are numbered on from the newest kept,
read in the same transaction, so a new leader never reuses a number its predecessor gave.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from llmgw_twin import codec
from llmgw_twin.control.durable import (
    DurableState,
    PutClock,
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
from llmgw_twin.store.rows import apply_write, event_of, event_text, times_of, upsert

EVENTS_KEPT = 50_000
"""How many of the newest events a store keeps, unless told otherwise."""

R = TypeVar("R")


class StoreError(Exception):
    pass


class Fenced(StoreError):
    """A commit or renewal in an epoch the store no longer holds: its controller was deposed."""


class SqlStore(ABC):
    """The store over one connection, used by one thread at a time."""

    path: str
    events_kept: int

    # --- the dialect -------------------------------------------------------------------------

    @abstractmethod
    def _exec(self, statement: str, values: Sequence[object] = ()) -> Any:
        """Run one statement (`?` placeholders); a cursor to fetch from."""

    @abstractmethod
    def _begin(self) -> None:
        """Start a transaction that writes."""

    @abstractmethod
    def _locked(self, share: bool) -> str:
        """The clause that locks a row read in a transaction (empty where the transaction
        holds the whole store already)."""

    @abstractmethod
    def now_ms(self) -> int:
        """The store's clock: the one that decides when a lease expires."""

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> SqlStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _transaction(self, work: Callable[[], R]) -> R:
        self._begin()
        try:
            out = work()
            self._exec("COMMIT")
        except BaseException as e:
            self._rollback(e)
            raise
        return out

    def _rollback(self, cause: BaseException) -> None:
        """Undo the transaction `cause` broke off, if the database has not already: SQLite ends
        one itself on some errors (a full disk, an I/O error), and a ROLLBACK then fails with an
        error of its own ("no transaction is active") that would hide the one saying what went
        wrong. `cause` is what the caller raises, with a failed rollback noted on it."""
        try:
            self._exec("ROLLBACK")
        except Exception as e:
            cause.add_note(f"(the rollback after it failed too: {e})")

    def commit(
        self, writes: Iterable[Write], events: Sequence[TraceEvent] = (), epoch: int | None = None
    ) -> None:
        """Apply one decision's writes atomically, and append `events` to the event log in the
        same transaction (numbered on from the newest, the oldest beyond `events_kept`
        dropped); returns once they are durable. With `epoch`, only while the lease is in that
        epoch (else `Fenced`, and nothing is written): a deposed leader's decision never lands."""
        batch = list(writes)
        if not batch and not events:
            # nothing to write: a read of the lease is as good a moment as a transaction's
            # (the twin's steps that only emit events are two thirds of its commits)
            if epoch is not None:
                self._fence(self._lease_row(), epoch)
            return
        if epoch is not None and not events and len(batch) == 1:
            match batch[0]:
                case PutClock(now_ms=t):
                    self._put_clock(t, epoch)
                    return

        def work() -> None:
            if epoch is not None:
                self._fence(self._lease_row(lock=True, share=True), epoch)
            if events:
                first = self._next_event()
                for i, ev in enumerate(events):
                    self._exec("INSERT INTO events VALUES (?, ?)", (first + i, event_text(ev)))
                end = first + len(events)
                self._exec("DELETE FROM events WHERE seq < ?", (end - self.events_kept,))
            for w in batch:
                apply_write(self._exec, w)

        self._transaction(work)

    def _put_clock(self, now_ms: int, epoch: int) -> None:
        """A quiet leader's one write, once a heartbeat interval: the clock, fenced in the same
        statement (the lease row read, locked where the dialect locks rows, and the clock written
        only while it is in `epoch`), as a renewal is: a transaction around the fence's read and
        the write was most of a quiet twin day's store time."""
        lock = self._locked(share=True)
        done = self._exec(
            "INSERT INTO clock SELECT 0, ? WHERE EXISTS "  # noqa: S608
            f"(SELECT 1 FROM lease WHERE id = 0 AND epoch = ?{lock}) "
            "ON CONFLICT (id) DO UPDATE SET now_ms = excluded.now_ms",
            (now_ms, epoch),
        )
        if done.rowcount != 1:
            raise Fenced(f"{self.path}: the lease is no longer in epoch {epoch}")

    def _fence(self, held: Lease | None, epoch: int) -> None:
        if held is None or held.epoch != epoch:
            raise Fenced(f"{self.path}: the lease is no longer in epoch {epoch}")

    def _next_event(self) -> int:
        newest = self._exec("SELECT MAX(seq) FROM events").fetchone()[0]
        return 0 if newest is None else int(newest) + 1

    # --- the leader lease (`control.lease`): the caller gives the store's time --------------

    def lease(self) -> Lease | None:
        return self._lease_row()

    def claim_lease(self, who: str, now_ms: int, lease_ms: int) -> Lease | None:
        """Lead from now, in a new epoch, if the lease is free (`lease.claim`)."""
        return self._lease_change(lambda cur: claim(cur, who, now_ms, lease_ms))

    def renew_lease(self, who: str, epoch: int, now_ms: int, lease_ms: int) -> Lease:
        """Extend the lease of the leader in `epoch`; `Fenced` if it was deposed. `renew`'s
        decision in one conditional write, the row read and written by one statement: the
        new expiry where the row still names `who` in `epoch`, else nothing (a leader renews
        every third of its lease, and a transaction around a read and a write cost a quiet
        twin's day a third of its time)."""
        got = renew(Lease(who, epoch, 0), who, epoch, now_ms, lease_ms)
        assert got is not None  # (the row the statement requires renews so)
        done = self._exec(
            "UPDATE lease SET expires_ms = ? WHERE id = 0 AND holder = ? AND epoch = ?",
            (got.expires_ms, who, epoch),
        )
        if done.rowcount != 1:
            raise Fenced(f"{self.path}: {who} no longer holds the lease in epoch {epoch}")
        return got

    def _lease_row(self, lock: bool = False, share: bool = False) -> Lease | None:
        """The lease (None before any); `lock`: locked for the rest of the transaction."""
        clause = self._locked(share) if lock else ""
        row = self._exec(f"SELECT holder, epoch, expires_ms FROM lease WHERE id = 0{clause}")  # noqa: S608
        got = row.fetchone()
        if got is None or int(got[1]) == 0:
            return None
        return Lease(str(got[0]), int(got[1]), int(got[2]))

    def _lease_change(self, decide: Callable[[Lease | None], Lease | None]) -> Lease | None:
        def work() -> Lease | None:
            # the row exists from the first claim on, so that it can be locked: two first
            # claims at once are one after the other, and the second sees the first's epoch
            self._exec("INSERT INTO lease VALUES (0, '', 0, 0) ON CONFLICT (id) DO NOTHING")
            new = decide(self._lease_row(lock=True))
            if new is not None:
                upsert(self._exec, "lease", (0, new.holder, new.epoch, new.expires_ms))
            return new

        return self._transaction(work)

    def load_events(self) -> tuple[int, list[TraceEvent]]:
        """The number of the oldest event kept (of the next one, when none is) and the newest
        `events_kept` events, oldest first, numbered on from it."""
        following = self._next_event()
        query = "SELECT seq, body FROM events WHERE seq >= ? ORDER BY seq"
        rows = self._exec(query, (following - self.events_kept,)).fetchall()
        first = int(rows[0][0]) if rows else following
        out: list[TraceEvent] = []
        for seq, body in rows:
            if seq != first + len(out):
                raise StoreError(f"{self.path}: events: event {first + len(out)} is missing")
            try:
                out.append(event_of(body))
            except (ValueError, TypeError) as err:
                raise StoreError(f"{self.path}: events row {seq}: {err}") from err
        return first, out

    def put_controller(self, name: str, url: str) -> None:
        """A controller says where it is reached, now in the store's time (a standby at each
        claim it tries, the leader at each renewal)."""
        self._transaction(lambda: upsert(self._exec, "controllers", (name, url, self.now_ms())))

    def controllers(self) -> list[tuple[str, str, int]]:
        """(name, url, last said, in the store's time) of every controller that said so."""
        rows = self._exec("SELECT name, url, seen_ms FROM controllers ORDER BY name").fetchall()
        return [(str(n), str(u), int(t)) for n, u, t in rows]

    def put_agent_url(self, node: NodeId, url: str) -> None:
        """Remember where a node's agent listens, so a restarted controller can reach it."""
        self._transaction(lambda: upsert(self._exec, "agent_urls", (node, url)))

    def put_credential(self, node: str, token_sha256: str, agent_url: str, issued_ms: int) -> None:
        """Bind a node's credential (replacing the one it had: rotation), durably."""
        row = (node, token_sha256, agent_url, issued_ms)
        self._transaction(lambda: upsert(self._exec, "node_credentials", row))

    def delete_credential(self, node: str) -> None:
        self._transaction(
            lambda: self._exec("DELETE FROM node_credentials WHERE node = ?", (node,))
        )

    def credentials(self) -> list[tuple[str, str, str, int]]:
        """(node, token_sha256, agent_url, issued_ms) of every node credential, by node."""
        rows = self._exec(
            "SELECT node, token_sha256, agent_url, issued_ms FROM node_credentials ORDER BY node"
        ).fetchall()
        return [(str(n), str(h), str(u), int(t)) for n, h, u, t in rows]

    def agent_urls(self) -> dict[NodeId, str]:
        rows = self._exec("SELECT node, url FROM agent_urls ORDER BY node").fetchall()
        return {NodeId(n): str(u) for n, u in rows}

    def load(self) -> DurableState:
        db = self

        def rows(cls: type[R], table: str, key: str) -> tuple[R, ...]:
            query = f"SELECT {key}, body FROM {table} ORDER BY {key}"  # noqa: S608
            out: list[R] = []
            for k, body in db._exec(query).fetchall():
                try:
                    out.append(codec.loads(cls, body))
                except codec.CodecError as err:
                    raise StoreError(f"{self.path}: {table} row {k!r}: {err}") from err
            return tuple(out)

        seqs = tuple(
            (ModelName(m), int(s))
            for m, s in db._exec("SELECT model, seq FROM seqs ORDER BY model").fetchall()
        )
        failed = tuple(
            (NodeId(n), int(g))
            for n, g in db._exec("SELECT node, gpu FROM failed_gpus ORDER BY node, gpu")
        )
        silent = tuple(
            (NodeId(n), int(t))
            for n, t in db._exec("SELECT node, since_ms FROM silence ORDER BY node")
        )
        clock = db._exec("SELECT now_ms FROM clock WHERE id = 0").fetchone()
        quarantines: list[QuarantineRow] = []
        for n, p, body in db._exec(
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
                for n, d in db._exec("SELECT node, draining FROM cordons ORDER BY node")
            ),
            model_failures=tuple(
                (ModelName(m), times_of(t))
                for m, t in db._exec("SELECT model, times FROM model_failures ORDER BY model")
            ),
            node_failures=tuple(
                ((NodeId(n), ProfileName(p)), times_of(t))
                for n, p, t in db._exec(
                    "SELECT node, profile, times FROM node_failures ORDER BY node, profile"
                )
            ),
        )
