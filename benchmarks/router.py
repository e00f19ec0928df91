"""The router service's cost: sim engines behind `llmgw-twin router`, against the same engines
asked directly, side by side in one run.

    .venv/bin/python benchmarks/router.py [--engines 2] [--concurrency 1,8,32] [--rounds 3]
                                          [--requests 400] [--max-seconds 30] [--max-tokens 16]
                                          [--clients 2]

Started here, each a process in its own session: `--engines` sim engines (1-node replicas of
one model, no token latency, so what is measured is the HTTP path and not the simulated
compute) and one `llmgw-twin router`, which follows a fake controller feed served from this
process (one snapshot naming the engines, then nothing new). For each mode (a whole answer, a
stream) and each concurrency level, `--requests` chat completions (each `--max-tokens`
tokens) are sent with that many in flight straight to the engines (round-robin, as the router
spreads them) and through the router, `--rounds` times, which goes first in turn (direct then
router, router then direct, ...), so that what else the machine does falls on both alike; each
cell is bounded by `--max-seconds` too.

The requests in flight are spread over `--clients` client processes (at most one per request in
flight), which begin together. One Python client (httpx) spends about a millisecond of CPU on
each request: at 8 in flight it is busy most of a core, and its own queueing, not the router's
work, became most of what the router seemed to cost (a p99 twice direct's, from answers that
reach one busy client together); docs/performance.md, "The router", has both figures.

Latency is the whole answer, its last byte included; a failed request is counted, not timed.
Prints one markdown table: the median over the rounds of p50 and p99 both ways, of what the
router adds, of requests per second both ways and of their ratio, with the ratio's lowest and
highest round. Everything is on 127.0.0.1, and the clients, the router and the engines share
this machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing import get_context
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx

from bench_progress import step

MODEL = "bench"
START_DEADLINE_S = 60.0
CLIENT_START_S = 0.5
"""How long after a cell is handed out its clients begin: time for each to open its
connections (untimed)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Procs:
    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, *args: str) -> None:
        launch = ["-m", "llmgw_twin.cli"]
        with (self.log_dir / f"{name}.log").open("wb") as log:
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, *launch, *args],
                    start_new_session=True,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )

    def close(self) -> None:
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)


def feed_server(endpoints: list[str]) -> ThreadingHTTPServer:
    """A controller's feed that names `endpoints` once, then has no news."""
    snapshot = [
        {"model": MODEL, "replica": f"{MODEL}-r{i + 1}", "state": "ready", "endpoint": url}
        for i, url in enumerate(endpoints)
    ]

    class Feed(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = parse_qs(urlparse(self.path).query)
            first = "epoch" not in query
            if not first:  # a long poll with no news
                time.sleep(min(int(query.get("wait_ms", ["0"])[0]), 20_000) / 1000)
            page = {
                "epoch": "bench",
                "next": 0,
                "models": [MODEL],
                "snapshot": snapshot if first else None,
                "events": [],
            }
            body = json.dumps(page).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Feed)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def wait_until(probe: Any, what: str) -> None:
    deadline = time.monotonic() + START_DEADLINE_S
    with httpx.Client(trust_env=False, timeout=5) as c:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if probe(c):
                    return
            time.sleep(0.1)
    raise SystemExit(f"{what} did not come up within {START_DEADLINE_S} s")


@dataclass
class Cell:
    latencies_s: list[float] = field(default_factory=list)
    failed: int = 0
    wall_s: float = 0.0

    def pct(self, q: float) -> float:
        xs = sorted(self.latencies_s)
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000 if xs else float("nan")

    @property
    def rate(self) -> float:
        return len(self.latencies_s) / self.wall_s if self.wall_s else 0.0


async def run_cell(
    bases: list[str],
    concurrency: int,
    requests: int,
    max_s: float,
    stream: bool,
    tokens: int,
    start_at: float | None = None,
) -> Cell:
    """One client's cell: `requests` requests, `concurrency` in flight. `start_at`: the
    `time.monotonic()` (one clock for every process here) at which the timed requests begin,
    once the connections are open, so that clients in other processes begin with it."""
    cell = Cell()
    limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(trust_env=False, timeout=60, limits=limits) as client:
        next_i = 0

        async def one(i: int) -> None:
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"request {i}"}],
                "max_tokens": tokens,
                "stream": stream,
            }
            url = bases[i % len(bases)] + "/v1/chat/completions"
            t0 = time.perf_counter()
            try:
                async with client.stream("POST", url, json=body) as r:
                    async for _ in r.aiter_raw():
                        pass
                    ok = r.status_code == 200
            except httpx.HTTPError:
                ok = False
            if ok:
                cell.latencies_s.append(time.perf_counter() - t0)
            else:
                cell.failed += 1

        async def worker() -> None:
            nonlocal next_i
            while next_i < requests and time.perf_counter() < deadline:
                i = next_i
                next_i += 1
                await one(i)

        # open the connections first, not timed
        await asyncio.gather(*(one(-1 - i) for i in range(concurrency)))
        cell.latencies_s.clear()
        cell.failed = 0
        if start_at is not None:
            await asyncio.sleep(max(0.0, start_at - time.monotonic()))
        deadline = time.perf_counter() + max_s
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        cell.wall_s = time.perf_counter() - started
    return cell


def client_cell(
    bases: list[str],
    concurrency: int,
    requests: int,
    max_s: float,
    stream: bool,
    tokens: int,
    start_at: float,
) -> tuple[list[float], int, float]:
    """`run_cell` in a client process of its own: its latencies, failures and end."""
    cell = asyncio.run(run_cell(bases, concurrency, requests, max_s, stream, tokens, start_at))
    return cell.latencies_s, cell.failed, time.monotonic()


def split(total: int, parts: int) -> list[int]:
    """`total` in `parts` shares differing by at most one."""
    return [total // parts + (1 if k < total % parts else 0) for k in range(parts)]


def measure(
    pool: ProcessPoolExecutor,
    clients: int,
    bases: list[str],
    level: int,
    requests: int,
    max_s: float,
    stream: bool,
    tokens: int,
) -> Cell:
    """One cell: `level` requests in flight spread over up to `clients` client processes
    (as many as there are requests in flight), beginning together; latencies of all, rate over
    the wall time from the common start to the last client's end."""
    k = max(1, min(clients, level))
    start_at = time.monotonic() + CLIENT_START_S
    futures = [
        pool.submit(client_cell, bases, c, n, max_s, stream, tokens, start_at)
        for c, n in zip(split(level, k), split(requests, k), strict=True)
    ]
    cell = Cell()
    ends = []
    for f in futures:
        latencies, failed, end = f.result()
        cell.latencies_s += latencies
        cell.failed += failed
        ends.append(end)
    cell.wall_s = max(ends) - start_at
    return cell


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def row(mode: str, level: int, rounds: list[tuple[Cell, Cell]]) -> str:
    """One line of the table: medians over the rounds, the ratio's spread."""
    dp50 = median([d.pct(0.5) for d, _ in rounds])
    dp99 = median([d.pct(0.99) for d, _ in rounds])
    rp50 = median([r.pct(0.5) for _, r in rounds])
    rp99 = median([r.pct(0.99) for _, r in rounds])
    add50 = median([r.pct(0.5) - d.pct(0.5) for d, r in rounds])
    add99 = median([r.pct(0.99) - d.pct(0.99) for d, r in rounds])
    ratios = [r.rate / d.rate if d.rate else 0.0 for d, r in rounds]
    failed = f"{sum(d.failed for d, _ in rounds)} / {sum(r.failed for _, r in rounds)}"
    return (
        f"| {mode} | {level} | {dp50:.1f} / {dp99:.1f} ms | {rp50:.1f} / {rp99:.1f} ms "
        f"| {add50:+.1f} / {add99:+.1f} ms "
        f"| {median([d.rate for d, _ in rounds]):.0f} | {median([r.rate for _, r in rounds]):.0f} "
        f"| {median(ratios):.2f} | {min(ratios):.2f} - {max(ratios):.2f} | {failed} |"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--max-seconds", type=float, default=30.0)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--clients", type=int, default=2)
    args = p.parse_args()
    if args.clients < 1:
        p.error("--clients: at least 1")
    if args.rounds < 1:
        p.error("--rounds: at least 1")
    levels = [int(x) for x in args.concurrency.split(",")]

    with (
        ProcessPoolExecutor(args.clients, mp_context=get_context("spawn")) as pool,
        tempfile.TemporaryDirectory(prefix="router-bench-") as tmp,
    ):
        procs = Procs(Path(tmp))
        feed: ThreadingHTTPServer | None = None
        try:
            step(f"starting {args.engines} sim engines and a router")
            ports = [free_port() for _ in range(args.engines)]
            engines = [f"http://127.0.0.1:{port}" for port in ports]
            for i, port in enumerate(ports):
                procs.start(
                    f"engine{i}",
                    *("sim-engine", "--model", f"/models/{MODEL}", "--served-model-name", MODEL),
                    *("--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"),
                )
            feed = feed_server(engines)
            router_port = free_port()
            router = f"http://127.0.0.1:{router_port}"
            config = Path(tmp) / "router.yaml"
            config.write_text(
                f"listen: {{host: 127.0.0.1, port: {router_port}}}\n"
                f"controller: http://127.0.0.1:{feed.server_address[1]}\n"
                "limits: {max_outstanding_per_replica: 256}\n"
            )
            procs.start("router", "router", "--config", str(config), "--log-level", "warning")
            for url in engines:
                wait_until(lambda c, u=url: c.get(u + "/health").status_code == 200, url)

            def routable(c: httpx.Client) -> bool:
                data = c.get(router + "/v1/models").json()["data"]
                return bool(data) and data[0]["ready_replicas"] == len(engines)

            wait_until(routable, "the router")

            print(
                f"{args.engines} sim engines, "
                f"{args.max_tokens} tokens per answer, "
                f"{args.requests} requests per cell (at most {args.max_seconds:g} s), "
                f"{args.rounds} rounds of both, which goes first in turn, medians; "
                f"in flight spread over up to {args.clients} client processes\n"
            )
            print(
                "| answer | in flight | direct p50 / p99 | router p50 / p99 | added p50 / p99 "
                "| direct req/s | router req/s | router / direct | lowest - highest | failed |"
            )
            print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
            for stream in (False, True):
                for level in levels:
                    mode = "stream" if stream else "whole"
                    rounds: list[tuple[Cell, Cell]] = []
                    targets = {"direct": engines, "the router": [router]}
                    for n in range(args.rounds):
                        # in turn which goes first, so that a machine slowing down or speeding
                        # up over a round falls on both alike
                        names = ["direct", "the router"][:: 1 if n % 2 == 0 else -1]
                        step(f"{mode}, {level} in flight, round {n + 1}: {' then '.join(names)}")
                        cells = {
                            name: measure(
                                pool,
                                args.clients,
                                targets[name],
                                level,
                                args.requests,
                                args.max_seconds,
                                stream,
                                args.max_tokens,
                            )
                            for name in names
                        }
                        rounds.append((cells["direct"], cells["the router"]))
                    print(row(mode, level, rounds), flush=True)
        finally:
            procs.close()
            if feed is not None:
                feed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
