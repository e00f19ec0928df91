"""What the controller and the agent commands share: their flags, logging, and the uvicorn run.

Both serve one FastAPI app until SIGINT or SIGTERM, which uvicorn turns into a graceful shutdown
(the app's lifespan then stops what the runtime started). Exit status: 0 once the server had
started, 1 when it never did (its port taken, say); configuration errors are the callers' (2).
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Protocol

import uvicorn
from fastapi import FastAPI
from fastapi.telemetry import TelemetryConfig

from llmgw_twin.service.common.lane import Lane
from llmgw_twin.service.common.listener import DEFAULT_LISTEN_LIMITS, ListenLimits, uvicorn_options
from llmgw_twin.service.common.tls import ServerTls

NO_TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}
"""FastAPI's own OpenTelemetry hooks, off: asking whether they are on costs every request more
than a heartbeat's own work does, and no service here exports to OpenTelemetry."""
EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2
GRACEFUL_SHUTDOWN_S = 5
"""How long a shutdown waits for open connections before it stops the app anyway. Without a
bound, a TLS connection a peer keeps idle in its pool holds the shutdown for asyncio's TLS
close timeout (30 s): the peer answers the close only when it next uses the connection."""
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
log = logging.getLogger("llmgw_twin.serving")


MAX_WAIT_S = 600.0
"""The longest `--not-before` wait."""


def add_arguments(parser: argparse.ArgumentParser, config_help: str) -> None:
    parser.add_argument("--config", required=True, metavar="FILE", help=config_help)
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning"))
    parser.add_argument(
        "--not-before",
        type=int,
        metavar="NS",
        help="wait until the host's monotonic clock reads NS (in ns) before serving: the "
        "controller loads its code and reads its config, then waits before it listens and opens "
        "its store; the agent also reads the node first, and waits before it registers. A restart "
        "whose start-up costs no downtime (real mode restarts processes exactly when its "
        "scenario says with it)",
    )


def not_before_wait_s(not_before_ns: int) -> float:
    """How long to wait from now for `--not-before NS`: none once it passed, at most
    `MAX_WAIT_S`."""
    return min(max(0.0, (not_before_ns - time.monotonic_ns()) / 1e9), MAX_WAIT_S)


def wait_not_before(args: argparse.Namespace) -> None:
    """`--not-before`: sleep until that instant (the controller, before it reads anything)."""
    if args.not_before is not None:
        time.sleep(not_before_wait_s(args.not_before))


def setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT, stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not one line per request


class Runtime(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


def lifespan_of(runtime: Runtime) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The app's lifespan: the runtime starts before the first request and stops after the
    last one."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await runtime.start()
        try:
            yield
        finally:
            await runtime.stop()

    return lifespan


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket listening on `host:port` from now (raises OSError when it cannot be bound):
    a client that connects while the server still starts waits in its backlog until the server
    accepts, rather than being refused and retrying later."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)  # uvicorn's default backlog
    except OSError:
        sock.close()
        raise
    return sock


def listen_url(host: str, port: int, tls: bool, sock: socket.socket | None = None) -> str:
    """The address the server is reached at, as a client writes it: `sock`'s own port when
    given (a port 0 in the config is the one the system chose)."""
    if sock is not None:
        port = int(sock.getsockname()[1])
    shown = f"[{host}]" if ":" in host else host
    return f"{'https' if tls else 'http'}://{shown}:{port}"


def serve(
    app: FastAPI,
    host: str,
    port: int,
    log_level: str,
    tls: ServerTls | None = None,
    sock: socket.socket | None = None,
    limits: ListenLimits = DEFAULT_LISTEN_LIMITS,
    lane: Lane | None = None,
) -> int:
    """Serve `app`; over TLS when `tls` is given (mutual TLS when it names a client CA); on
    `sock` when given (`listen`), else on a socket bound once the app's start-up is done; with
    the connection cap, the timeouts and the head's bound of `limits` (`listener.py`); the
    requests `lane` takes served ahead of the app (`lane.py`)."""
    options = tls.uvicorn_options() if tls is not None else {}
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        lifespan="on",
        access_log=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        **uvicorn_options(limits, lane),
        **options,
    )
    server = uvicorn.Server(config)
    # uvicorn names no address when it is handed a socket: the log says where to reach us
    log.info("listening on %s", listen_url(host, port, tls is not None, sock))
    server.run(sockets=None if sock is None else [sock])
    return EXIT_OK if server.started else EXIT_FAILED
