"""`llmgw-twin sidecar`: a shard's small companion process, and where its readiness is read.

Role: the agent starts a shard's sidecar before its engine and starts the engine only once the
sidecar answers. The sidecar serves, on a loopback port:

- `GET /health` -> 200 `{"status": "ok", "shard": ...}` once it is up;
- `GET /engine` -> 200 `{"shard", "probe", "target", "up", "detail"}`: the engine's state, read
  at the moment of the request: `probe: "http"` GETs the engine's health URL (up on a 200),
  `probe: "tcp"` connects to the engine's port (up when it accepts), `probe: "file"` looks for
  the file a rank that opens no port writes once ready (a sim worker's `--ready-file`: up when it
  exists), `probe: "none"` for a rank that opens no port and writes no such file (`up` is then
  null: the agent judges it by its process).

Invariants: stdlib only (it starts in well under a second and costs a few MiB); every probe is
one bounded attempt (`PROBE_TIMEOUT_S`), direct to the address given (no proxy); it serves
until SIGTERM or SIGINT, then exits at once (the agent stops it with its process group).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

PROBE_TIMEOUT_S = 1.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to serve on (loopback)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--shard", default="", help="the shard's name, REPLICA/RANK")
    probe = parser.add_mutually_exclusive_group()
    probe.add_argument("--probe-http", metavar="URL", help="the engine's health URL")
    probe.add_argument("--probe-tcp", metavar="HOST:PORT", help="the engine's listening port")
    probe.add_argument("--probe-file", metavar="PATH", help="the file the engine writes when ready")


def probe_http(url: str) -> tuple[bool, str]:
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname is None:
        return False, f"not an http URL: {url}"
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=PROBE_TIMEOUT_S)
    try:
        conn.request("GET", parts.path or "/")
        status = conn.getresponse().status
    except (OSError, http.client.HTTPException) as e:
        return False, f"no answer: {type(e).__name__}: {e}"
    finally:
        conn.close()
    return status == 200, f"status {status}"


def probe_tcp(target: str) -> tuple[bool, str]:
    host, _, port = target.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S):
            return True, "accepts connections"
    except (OSError, ValueError) as e:
        return False, f"no connection: {type(e).__name__}: {e}"


def engine_state(args: argparse.Namespace) -> dict[str, Any]:
    if args.probe_http:
        up, detail = probe_http(args.probe_http)
        return {"probe": "http", "target": args.probe_http, "up": up, "detail": detail}
    if args.probe_tcp:
        up, detail = probe_tcp(args.probe_tcp)
        return {"probe": "tcp", "target": args.probe_tcp, "up": up, "detail": detail}
    if args.probe_file:
        up = os.path.exists(args.probe_file)
        detail = "written" if up else "not written yet"
        return {"probe": "file", "target": args.probe_file, "up": up, "detail": detail}
    return {"probe": "none", "target": None, "up": None, "detail": "the rank opens no port"}


def make_handler(args: argparse.Namespace) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/health":
                self._reply(200, {"status": "ok", "shard": args.shard})
            elif self.path == "/engine":
                self._reply(200, {"shard": args.shard, **engine_state(args)})
            else:
                self._reply(404, {"detail": f"no such path: {self.path} (try /health, /engine)"})

        def _reply(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *fmt_args: Any) -> None:
            pass  # one line per probe would drown the shard's log

    return Handler


def main(args: argparse.Namespace) -> int:
    try:
        server = ThreadingHTTPServer((args.host, args.port), make_handler(args))
    except OSError as e:
        print(
            f"sidecar {args.shard}: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr
        )
        return 1
    server.daemon_threads = True

    def on_signal(_sig: int, _frame: FrameType | None) -> None:
        # nothing to finish or save: a probe in flight is one the agent no longer awaits, and
        # the kernel closes the sockets. Exiting at once, rather than at serve_forever's next
        # poll, lets the agent start the next shard on these GPUs that much sooner.
        os._exit(0)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="llmgw-twin sidecar", description=__doc__)
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
