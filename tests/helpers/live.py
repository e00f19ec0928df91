"""A FastAPI app served by uvicorn on a loopback port the test chose (bound to port 0 here, so the
kernel picks a free one), in a thread of its own: real HTTP, the app's lifespan included."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from helpers.services import wait_sync


@contextmanager
def live_server(
    build: Callable[[], FastAPI], within_s: float = 30, options: dict[str, Any] | None = None
) -> Iterator[str]:
    """Serve the app `build` makes until the block ends; yields its base URL,
    `http://127.0.0.1:PORT`. The app is built in the server's thread: a runtime that opens
    SQLite must use it where it opened it. `options`: more `uvicorn.Config` arguments (the
    services' own listener: `listener.uvicorn_options`)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    servers: list[uvicorn.Server] = []

    def run() -> None:
        config = uvicorn.Config(
            build(), lifespan="on", log_level="warning", access_log=False, **(options or {})
        )
        servers.append(uvicorn.Server(config))
        servers[0].run(sockets=[sock])

    thread = threading.Thread(target=run, name=f"uvicorn-{port}", daemon=True)
    thread.start()

    def up() -> bool | None:
        if not thread.is_alive():
            raise AssertionError("uvicorn stopped before it started (see the log above)")
        return True if servers and servers[0].started else None

    try:
        wait_sync(up, within_s, "uvicorn to start")
        yield f"http://127.0.0.1:{port}"
    finally:
        if servers:
            servers[0].should_exit = True
        thread.join(within_s)
        sock.close()
        assert not thread.is_alive(), "uvicorn did not shut down"


@contextmanager
def live_controller(build: Callable[[], FastAPI], within_s: float = 30) -> Iterator[str]:
    """`live_server` for a controller app, yielding once it leads: a controller serves from its
    start and claims the lease in the background, answering as a standby (503) until then, and
    on a busy machine the claim may come well after the port is open."""
    with live_server(build, within_s) as url:
        wait_sync(lambda: _leads(url), within_s, "the controller to lead")
        yield url


def _leads(url: str) -> bool | None:
    r = httpx.get(url + "/health", timeout=5, trust_env=False)
    return True if r.status_code == 200 and r.json().get("status") == "ok" else None
