"""Which store a controller's `store` setting names: a `postgresql://` URL is a PostgreSQL
database several controllers share, anything else a SQLite file (the embedded default)."""

from __future__ import annotations

from llmgw_twin.store.base import EVENTS_KEPT, SqlStore
from llmgw_twin.store.postgres import PgStore, is_postgres_url
from llmgw_twin.store.sqlite import Store


def open_store(target: str, *, events_kept: int = EVENTS_KEPT) -> SqlStore:
    if is_postgres_url(target):
        return PgStore(target, events_kept=events_kept)
    return Store(target, events_kept=events_kept)
