"""A throwaway PostgreSQL server for one test run: initdb in a temporary folder, listening on a
Unix socket only (no TCP port to collide with another run), stopped and removed at the end.

Run as root (CI), the server runs as the `postgres` system user that Debian's package creates,
since PostgreSQL refuses to run as root; run as anyone else, it runs as that user. The binaries
are Debian's (`scripts/install-postgresql.sh` installs them); a machine without them fails the
tests that ask for one, it does not skip them.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from helpers.services import wait_sync

PG_ROOTS = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)


def _bin(name: str) -> str:
    for root in PG_ROOTS:
        if (root / name).exists():
            return str(root / name)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} not found: run scripts/install-postgresql.sh (make test does)")
    return found


def _as_owner(argv: list[str], owner: str | None) -> list[str]:
    return ["runuser", "-u", owner, "--", *argv] if owner else argv


@contextmanager
def postgres_server() -> Iterator[str]:
    """A running server; yields a connection URL (database `postgres`, over the socket)."""
    owner = "postgres" if os.geteuid() == 0 else None
    top = Path(tempfile.mkdtemp(prefix="llmgw-pg-"))
    data, sock = top / "data", top / "sock"
    sock.mkdir()
    if owner is not None:
        entry = pwd.getpwnam(owner)
        for path in (top, sock):
            os.chown(path, entry.pw_uid, entry.pw_gid)
    user = owner or pwd.getpwuid(os.geteuid()).pw_name
    proc: subprocess.Popen[bytes] | None = None
    try:
        subprocess.run(
            _as_owner([_bin("initdb"), "-D", str(data), "-A", "trust", "-U", user], owner),
            check=True,
            capture_output=True,
        )
        argv = [
            _bin("postgres"),
            "-D", str(data),
            "-k", str(sock),
            "-c", "listen_addresses=",
            "-c", "fsync=on",
        ]  # fmt: skip
        proc = subprocess.Popen(
            _as_owner(argv, owner),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        url = f"postgresql://{user}@/postgres?host={sock}"

        def ready() -> bool | None:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"postgres exited with {proc.returncode}")
            probe = subprocess.run(
                [_bin("pg_isready"), "-h", str(sock), "-U", user, "-d", "postgres"],
                capture_output=True,
                check=False,
            )
            return True if probe.returncode == 0 else None

        wait_sync(ready, 60, "the PostgreSQL server to accept connections")
        yield url
    finally:
        if proc is not None:
            proc.terminate()  # a smart shutdown; then at once, if it lingers
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
        shutil.rmtree(top, ignore_errors=True)


def fresh_database(url: str, name: str) -> str:
    """A new empty database on the server at `url`; its URL."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return url.replace("/postgres?", f"/{name}?")
