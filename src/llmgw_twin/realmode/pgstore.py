"""A throwaway PostgreSQL server for a real run whose controllers lose their store
(`partition_controller` from the store, `store_down`): the store is then a server, not a file,
and each controller reaches it through a proxy of its own (`CuttableProxy`), so the store can be
taken from one controller (its proxy cut) or from all (every proxy cut: to the controllers, the
database is down). A cut proxy refuses new connections and closes open ones, as a server that is
gone does.

The server is Debian's binaries (`make postgresql` installs them), initialised in a temporary
folder of its own (initdb, trust authentication, loopback only) and stopped (`pg_ctl stop -m
immediate`) and removed when the run ends. Run as root, it runs as the `postgres` system user,
since PostgreSQL refuses to run as root (as `tests/helpers/postgres.py` does).
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from llmgw_twin.realmode.proxy import CuttableProxy

PG_ROOTS = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
READY_WITHIN_S = 60.0


def pg_binary(name: str) -> str | None:
    for root in PG_ROOTS:
        if (root / name).exists():
            return str(root / name)
    return shutil.which(name)


def have_postgres() -> bool:
    return all(pg_binary(b) for b in ("initdb", "postgres", "pg_ctl", "pg_isready"))


def _as_owner(argv: list[str], owner: str | None) -> list[str]:
    return ["runuser", "-u", owner, "--", *argv] if owner else argv


def _reachable_tmp(owner: str | None) -> str:
    """Where the server's folder goes: the temporary folder, unless the server's own user
    could not reach into it (a TMPDIR under a folder only root may enter); then /tmp."""
    base = Path(tempfile.gettempdir()).resolve()
    if owner is None or all(p.stat().st_mode & 0o001 for p in (base, *base.parents)):
        return str(base)
    return "/tmp"  # noqa: S108 - a fresh mkdtemp folder in it, owned by the server's user


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RealPostgres:
    def __init__(self, names: list[str], env: Mapping[str, str] | None = None) -> None:
        self.env = dict(env) if env is not None else None
        """The server starts with the run's mark (`keeper.py`): a SIGKILLed run's keeper ends
        it too (its folder is outside the run's: the server's user must own it)."""
        self.owner = "postgres" if os.geteuid() == 0 else None
        self.user = self.owner or pwd.getpwuid(os.geteuid()).pw_name
        self.top = Path(tempfile.mkdtemp(prefix="llmgw-real-pg-", dir=_reachable_tmp(self.owner)))
        self.port = _free_port()
        self.proxies = {
            name: CuttableProxy("127.0.0.1", self.port, refuse_when_cut=True) for name in names
        }
        self._cuts = dict.fromkeys(names, 0)
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, name: str) -> str:
        """Where controller `name` reaches the store: through its own proxy."""
        return f"postgresql://{self.user}@127.0.0.1:{self.proxies[name].port}/postgres"

    async def start(self) -> None:
        await asyncio.to_thread(self._start_server)
        for proxy in self.proxies.values():
            await proxy.start()

    def _start_server(self) -> None:
        data, sock = self.top / "data", self.top / "sock"
        sock.mkdir()
        if self.owner is not None:
            entry = pwd.getpwnam(self.owner)
            for path in (self.top, sock):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        initdb = [str(pg_binary("initdb")), "-D", str(data), "-A", "trust", "-U", self.user]
        subprocess.run(_as_owner(initdb, self.owner), check=True, capture_output=True)  # noqa: S603
        argv = [str(pg_binary("postgres")), "-D", str(data), "-k", str(sock), "-p", str(self.port)]
        argv += ["-c", "listen_addresses=127.0.0.1"]
        self.proc = subprocess.Popen(  # noqa: S603 - Debian's server binary, a fixed argv
            _as_owner(argv, self.owner),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=self.env,
        )
        deadline = time.monotonic() + READY_WITHIN_S
        ready = [str(pg_binary("pg_isready")), "-h", "127.0.0.1", "-p", str(self.port)]
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited with {self.proc.returncode} at start")
            if subprocess.run(ready, capture_output=True, check=False).returncode == 0:  # noqa: S603
                return
            time.sleep(0.1)  # a server starting: nothing to await but its answer
        raise RuntimeError(f"postgres did not accept connections within {READY_WITHIN_S}s")

    def cut(self, names: list[str]) -> None:
        for name in names:  # overlapping outages: the link comes back with the last
            self._cuts[name] += 1
            self.proxies[name].cut()

    def heal(self, names: list[str]) -> None:
        for name in names:
            self._cuts[name] -= 1
            if self._cuts[name] == 0:
                self.proxies[name].heal()

    async def close(self) -> None:
        for proxy in self.proxies.values():
            await proxy.close()
        await asyncio.to_thread(self._stop_server)

    def _stop_server(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            stop = [
                str(pg_binary("pg_ctl")),
                "stop",
                "-D",
                str(self.top / "data"),
                "-m",
                "immediate",
            ]
            argv = _as_owner(stop, self.owner)
            subprocess.run(argv, capture_output=True, check=False, timeout=30)  # noqa: S603
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        shutil.rmtree(self.top, ignore_errors=True)
