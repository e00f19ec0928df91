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
from collections.abc import Sequence
from typing import Any

from llmgw_twin.store.base import EVENTS_KEPT, Fenced, SqlStore, StoreError
from llmgw_twin.store.schema import MIGRATIONS, SCHEMA_VERSION

__all__ = ["EVENTS_KEPT", "Fenced", "Store", "StoreError"]


class Store(SqlStore):
    """A controller's store in one SQLite file; `path=":memory:"` for a run that needs no file
    (the twin)."""

    def __init__(self, path: str, *, events_kept: int = EVENTS_KEPT) -> None:
        if events_kept < 1:
            raise ValueError(f"events_kept must be at least 1, got {events_kept}")
        self.path = path
        self.events_kept = events_kept
        # transactions are explicit; the controller commits from a worker thread, one use at a
        # time (`service.committer`), so the connection may be used from another thread
        try:
            self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
        except sqlite3.Error as e:  # SQLite's own words name no file ("unable to open ...")
            raise StoreError(f"{path}: cannot open the store: {e}") from None
        self._migrate()

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def _exec(self, statement: str, values: Sequence[object] = ()) -> Any:
        return self._db.execute(statement, tuple(values))

    def _rollback(self, cause: BaseException) -> None:
        if self._db.in_transaction:  # SQLite may have ended it itself (a full disk, say)
            super()._rollback(cause)

    def _begin(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")  # the whole file, for writing, until the end

    def _locked(self, share: bool) -> str:
        return ""  # BEGIN IMMEDIATE holds the store already

    def now_ms(self) -> int:
        """This machine's wall clock, as SQLite reads it: every process that opens the file runs
        here."""
        row = self._db.execute(
            "SELECT CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER)"
        ).fetchone()
        return int(row[0])

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
            except BaseException as e:
                self._rollback(e)
                raise
