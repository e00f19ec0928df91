"""The controller's durable state in PostgreSQL (psycopg 3): the store several controllers on
different machines share (docs/high-availability.md).

The same tables, statements and transactions as the SQLite store (`base.SqlStore`), in
PostgreSQL's dialect: `%s` placeholders, whole numbers as `BIGINT`, the schema version in a
table of its own, the lease row locked `FOR UPDATE` by a claim or renewal and `FOR SHARE` by a
conditional commit (so a claim waits for a commit under way, and the commit after it is refused),
and the store's clock the server's (`clock_timestamp()`), which every controller shares.

Invariants: as the SQLite store's; migrations run in one transaction each under an advisory
lock, so two controllers starting at once on an empty database do not both create the schema.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llmgw_twin.store.base import EVENTS_KEPT, SqlStore, StoreError
from llmgw_twin.store.schema import MIGRATIONS, SCHEMA_VERSION

MIGRATION_LOCK = 7_306_517
"""The advisory lock key held while the schema is migrated."""


def postgres_schema(statement: str) -> str:
    """A migration in PostgreSQL's words: whole numbers (times in ms) do not fit 32 bits."""
    return statement.replace("INTEGER", "BIGINT")


def is_postgres_url(target: str) -> bool:
    return target.startswith(("postgresql://", "postgres://"))


class PgStore(SqlStore):
    def __init__(self, url: str, *, events_kept: int = EVENTS_KEPT) -> None:
        if events_kept < 1:
            raise ValueError(f"events_kept must be at least 1, got {events_kept}")
        try:
            import psycopg
        except ImportError:
            raise StoreError(
                "a postgresql:// store needs psycopg: pip install 'llmgw-twin[postgres]'"
            ) from None
        self.path = _shown(url)
        self.events_kept = events_kept
        try:
            # transactions are explicit (BEGIN ... COMMIT), as the SQLite store's
            self._db = psycopg.connect(url, autocommit=True)
        except psycopg.Error as err:
            raise StoreError(f"{self.path}: cannot connect: {err}") from None
        self._migrate()

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> PgStore:
        return self

    def _exec(self, statement: str, values: Sequence[object] = ()) -> Any:
        return self._db.execute(statement.replace("?", "%s"), tuple(values))

    def _begin(self) -> None:
        self._db.execute("BEGIN ISOLATION LEVEL READ COMMITTED")

    def _locked(self, share: bool) -> str:
        return " FOR SHARE" if share else " FOR UPDATE"

    def now_ms(self) -> int:
        row = self._db.execute(
            "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint"
        ).fetchone()
        assert row is not None
        return int(row[0])

    @property
    def version(self) -> int:
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS schema_version "
            "(id INTEGER PRIMARY KEY CHECK (id = 0), version BIGINT NOT NULL)"
        )
        row = self._db.execute("SELECT version FROM schema_version WHERE id = 0").fetchone()
        return 0 if row is None else int(row[0])

    def _migrate(self) -> None:
        self._db.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
        try:
            have = self.version
            if have > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path}: store schema version {have} is newer than this controller's "
                    f"({SCHEMA_VERSION}); upgrade the controller"
                )
            for version in range(have + 1, SCHEMA_VERSION + 1):
                self._db.execute("BEGIN")
                try:
                    for statement in MIGRATIONS[version - 1].split(";"):
                        if statement.strip():
                            self._db.execute(postgres_schema(statement))
                    self._db.execute(
                        "INSERT INTO schema_version VALUES (0, %s) "
                        "ON CONFLICT (id) DO UPDATE SET version = excluded.version",
                        (version,),
                    )
                    self._db.execute("COMMIT")
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
        finally:
            self._db.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))


def _shown(url: str) -> str:
    """The URL without a password, for messages."""
    scheme, sep, rest = url.partition("://")
    creds, at, host = rest.rpartition("@")
    if not at or ":" not in creds:
        return url
    return f"{scheme}{sep}{creds.split(':', 1)[0]}:***@{host}"
