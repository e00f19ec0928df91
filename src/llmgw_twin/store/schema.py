"""The store's schema: every migration in order, each run once in its own transaction.

`PRAGMA user_version` counts the migrations a store has had; a store newer than this code is
refused (`Store`). A migration is only ever appended: one that shipped never changes.
"""

from __future__ import annotations

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
    # 3: health a restart must not forget: failed GPUs, quarantines, silence, the last clock
    """
    CREATE TABLE failed_gpus (node TEXT NOT NULL, gpu INTEGER NOT NULL, PRIMARY KEY (node, gpu));
    CREATE TABLE quarantines (
        node TEXT NOT NULL, profile TEXT NOT NULL, body TEXT NOT NULL, PRIMARY KEY (node, profile)
    );
    CREATE TABLE silence (node TEXT PRIMARY KEY, since_ms INTEGER NOT NULL);
    CREATE TABLE clock (id INTEGER PRIMARY KEY CHECK (id = 0), now_ms INTEGER NOT NULL);
    """,
    # 4: node credentials (the production shell's): the token's hash, never the token, and the
    # agent address the credential is bound to
    """
    CREATE TABLE node_credentials (
        node TEXT PRIMARY KEY, token_sha256 TEXT NOT NULL, agent_url TEXT NOT NULL,
        issued_ms INTEGER NOT NULL
    );
    """,
    # 5: the controller service's event log (`GET /v1/admin/events`), by its sequence number:
    # the newest events, so that they outlive the process
    """
    CREATE TABLE events (seq INTEGER PRIMARY KEY, body TEXT NOT NULL);
    """,
    # 6: the operator's cordons (draining: 1 while its replicas are moved off the node)
    """
    CREATE TABLE cordons (node TEXT PRIMARY KEY, draining INTEGER NOT NULL);
    """,
    # 7: the leader lease (docs/high-availability.md): who leads, in which epoch, until when
    """
    CREATE TABLE lease (
        id INTEGER PRIMARY KEY CHECK (id = 0), holder TEXT NOT NULL, epoch INTEGER NOT NULL,
        expires_ms INTEGER NOT NULL
    );
    """,
    # 8: the failure history that back-off and quarantines count on, so a successor counts on
    """
    CREATE TABLE model_failures (model TEXT PRIMARY KEY, times TEXT NOT NULL);
    CREATE TABLE node_failures (
        node TEXT NOT NULL, profile TEXT NOT NULL, times TEXT NOT NULL, PRIMARY KEY (node, profile)
    );
    """,
    # 9: the controllers that share the store, where each is reached and when it last said so
    # (in the store's time), so a standby can say where the leader is and `ctl status` can list
    # the standbys
    """
    CREATE TABLE controllers (name TEXT PRIMARY KEY, url TEXT NOT NULL, seen_ms INTEGER NOT NULL);
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)
