"""The production controller under a fleet's load: fake agents over loopback HTTP, measured.

    .venv/bin/python benchmarks/load.py [--nodes 1000,2000,5000,10000] [--steady 120]
                                        [--silence 0.01] [--interval 10]

For each size: one `llmgw-twin controller` process (pinned to CPU 0, credentials on, its
store on disk), and in this process (pinned to CPU 1) that many fake agents, each with its own
node token and its own keep-alive connection, plus one HTTP server answering the controller's
commands for all of them (`/n/{node}/v1/assign`). Each node has 8 GPUs; half of the nodes are
to hold a 1-node replica (a sim profile). The run:

1. onboards every node through the admin API (not timed), then registers them all at once;
2. heartbeats every `--interval` seconds at a seeded phase, each carrying the node's shards as
   the last assignment named them, reported serving at once (an agent reports a change at
   once, so a new assignment is answered by an immediate heartbeat);
3. waits until every replica is ready (bounded), then holds `--steady` seconds of steady state;
4. silences `--silence` of the nodes and waits until they are declared lost (bounded).

Measured: heartbeat latency p50/p99 in the steady window, heartbeats and sends that failed,
time until every replica was ready, the controller's CPU share and memory in the steady
window (and this process's own: the latency it measures includes its own delays), nodes
falsely declared suspect or lost (not silenced), and how long after its last heartbeat each
silenced node was declared lost. Beside the agents' latency, where it went: the controller's
own histograms over the steady window (a heartbeat's handling inside its app, its event loop's
lateness, its collector's pauses: `controller/timings.py`) and this process's own loop lateness,
so that a tail is put on one side of the connection or the other. Every loop is bounded in count
and time; all traffic is on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h11
import httpx
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from bench_progress import step
from llmgw_twin.service.common.auth import new_token, token_hash

GPUS = 8
FABRIC_SIZE = 100
LOST_MARGIN_S = 30.0
CLK_TCK = os.sysconf("SC_CLK_TCK")
NOISE_LIMIT_S = 1800
HISTOGRAMS = (
    "llmgw_heartbeat_handling_seconds",
    "llmgw_controller_loop_lateness_seconds",
    "llmgw_gc_pause_seconds",
)
"""The controller's own histograms (`controller/timings.py`), read before and after the steady
window: they say whether a latency tail is the controller's or this process's."""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Http1:
    """One keep-alive HTTP/1.1 connection (h11 over asyncio streams): a fake agent's own."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._conn = h11.Connection(h11.CLIENT)
        self.reconnects = 0

    async def _open(self) -> None:
        self._reader, self._writer = await asyncio.open_connection("127.0.0.1", self.port)
        self._conn = h11.Connection(h11.CLIENT)

    async def post(self, path: str, body: bytes, token: str) -> tuple[int, bytes]:
        """POST once; on a kept-alive connection the server closed meanwhile, once more on a
        new one (as any HTTP client does)."""
        reused = self._writer is not None
        try:
            return await self._post(path, body, token)
        except (OSError, h11.ProtocolError):
            await self.close()
            if not reused:
                raise
            self.reconnects += 1
            return await self._post(path, body, token)

    async def _post(self, path: str, body: bytes, token: str) -> tuple[int, bytes]:
        if self._writer is None:
            await self._open()
        assert self._reader is not None and self._writer is not None
        conn = self._conn
        headers = [
            ("host", "127.0.0.1"),
            ("content-type", "application/json"),
            ("content-length", str(len(body))),
            ("authorization", f"Bearer {token}"),
        ]
        data = conn.send(h11.Request(method="POST", target=path, headers=headers))
        data += conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())
        self._writer.write(data)
        status, chunks = 0, []
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                raw = await self._reader.read(65536)
                if not raw:
                    raise ConnectionError("the controller closed the connection")
                conn.receive_data(raw)
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                break
        if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
            conn.start_next_cycle()
        else:
            await self.close()
        return status, b"".join(chunks)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()
        self._reader = self._writer = None


@dataclass
class Agent:
    node: str
    fabric: str
    token: str = ""
    shards: list[dict[str, Any]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    silenced: bool = False
    last_beat_ms: float = 0.0
    registered: bool = False
    body: bytes | None = None
    """The heartbeat body, made again only when the node's shards change (a real agent sends
    the same bytes while nothing changes, too)."""


@dataclass
class Stats:
    latencies_ms: list[float] = field(default_factory=list)
    own_lateness_ms: list[float] = field(default_factory=list)
    """How late this process's own event loop woke a 100 ms probe, in the steady window."""
    measuring: bool = False
    beats: int = 0
    failed: int = 0
    refused: int = 0
    reconnects: int = 0


class Load:
    def __init__(self, args: argparse.Namespace, nodes: int, workdir: Path) -> None:
        self.args = args
        self.n = nodes
        self.workdir = workdir
        self.port = free_port()
        self.agents_port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.admin = new_token()
        self.headers = {"authorization": f"Bearer {self.admin}"}
        self.agents = {
            f"n{i:05d}": Agent(f"n{i:05d}", f"ib-{i // FABRIC_SIZE:03d}") for i in range(nodes)
        }
        self.stats = Stats()
        self.proc: subprocess.Popen[bytes] | None = None
        self.neighbours: list[subprocess.Popen[bytes]] = []
        self.shed = 0
        """State views the controller answered 503 (behind) to."""
        self.generator_share = 0.0
        """This process's CPU share in the steady window (the fake agents' side)."""
        self.stop = asyncio.Event()
        self.rng = random.Random(nodes)

    # --- the controller ------------------------------------------------------------------------

    def start_controller(self) -> None:
        config = {
            "listen": {"host": "127.0.0.1", "port": self.port},
            "store": str(self.workdir / "c.db"),
            "auth": {"admin_tokens": [token_hash(self.admin)]},
            "timings": {"heartbeat_interval": f"{self.args.interval}s"},
            "profiles": {
                "one": {"engine": "sim", "nodes": 1, "gpus_per_node": GPUS, "model": "/m/one"}
            },
        }
        (self.workdir / "c.yaml").write_text(json.dumps(config))
        log = (self.workdir / "controller.log").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llmgw_twin.cli", "controller", "--config", "c.yaml"],
            cwd=self.workdir,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: os.sched_setaffinity(0, {0}),  # noqa: PLW1509
        )
        log.close()

    def cpu_s(self) -> float:
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def rss_mib(self) -> float:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def start_neighbours(self) -> None:
        """`--noisy N`: N busy processes on the controller's CPU (a noisy neighbour), so that
        the controller gets about 1/(N+1) of its core and runs past its capacity. Each ends by
        itself after `NOISE_LIMIT_S`, and `stop_controller` kills them sooner."""
        code = (
            f"import time\nend = time.monotonic() + {NOISE_LIMIT_S}\n"
            "while time.monotonic() < end: pass"
        )
        for _ in range(self.args.noisy):
            self.neighbours.append(
                subprocess.Popen(
                    [sys.executable, "-c", code],
                    start_new_session=True,
                    preexec_fn=lambda: os.sched_setaffinity(0, {0}),  # noqa: PLW1509
                )
            )

    def stop_controller(self) -> None:
        for hog in self.neighbours:
            os.killpg(hog.pid, signal.SIGKILL)
            hog.wait(timeout=10)
        self.neighbours.clear()
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)

    # --- the agents' side -----------------------------------------------------------------------

    async def commands(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """The fake agents' API, for every node at once: `/n/{node}/v1/...`."""
        if scope["type"] != "http":
            return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        parts = scope["path"].split("/")
        agent = self.agents.get(parts[2]) if len(parts) > 3 else None
        if agent is not None and scope["path"].endswith("/v1/assign"):
            agent.shards = json.loads(body)["shards"]
            agent.body = None
            agent.changed.set()
        elif agent is not None and scope["path"].endswith("/v1/report-request"):
            agent.registered = False
            agent.changed.set()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b'{"ok": true}'})

    def registration(self, a: Agent) -> bytes:
        info = {"node": a.node, "fabric": a.fabric, "gpus": GPUS}
        info |= {"gpu_memory_mib": 81920, "engines": ["sim"]}
        return json.dumps(
            {
                "info": info,
                "shards": self.reports(a),
                "incarnation": 1,
                "agent_url": f"http://127.0.0.1:{self.agents_port}/n/{a.node}",
            }
        ).encode()

    def reports(self, a: Agent) -> list[dict[str, Any]]:
        out = []
        for spec in a.shards:
            leader = spec["rank"] == 0
            out.append(
                {
                    "spec": spec,
                    "state": "serving" if leader else "running",
                    "endpoint": f"http://127.0.0.1:9/{spec['replica']}" if leader else None,
                    "argv": ["llmgw-twin", "sim-engine"],
                }
            )
        return out

    async def agent(self, a: Agent) -> None:
        conn = Http1(self.port)
        interval = self.args.interval
        phase = self.rng.uniform(0, interval)
        next_beat = time.monotonic() + phase
        try:
            while not self.stop.is_set():
                if a.silenced:
                    return
                if not a.registered:
                    try:
                        status, _ = await conn.post(
                            "/v1/agents/register", self.registration(a), a.token
                        )
                        a.registered = status == 200
                    except (OSError, h11.ProtocolError):
                        await conn.close()
                        self.stats.failed += 1
                    if not a.registered:
                        await asyncio.sleep(1.0)
                    continue
                timeout = max(0.0, next_beat - time.monotonic())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(a.changed.wait(), timeout)
                if a.changed.is_set():
                    a.changed.clear()
                    if not a.registered:
                        continue
                else:
                    next_beat += interval
                await self.beat(a, conn)
        finally:
            self.stats.reconnects += conn.reconnects
            await conn.close()

    async def beat(self, a: Agent, conn: Http1) -> None:
        if a.body is None:
            a.body = json.dumps({"node": a.node, "shards": self.reports(a)}).encode()
        body = a.body
        t0 = time.perf_counter()
        a.last_beat_ms = time.time() * 1000
        try:
            status, reply = await conn.post("/v1/agents/heartbeat", body, a.token)
        except (OSError, h11.ProtocolError):
            await conn.close()
            self.stats.failed += 1
            return
        if self.stats.measuring:
            self.stats.latencies_ms.append((time.perf_counter() - t0) * 1000)
            self.stats.beats += 1
        if status != 200:
            self.stats.refused += 1
        elif json.loads(reply).get("report"):
            a.registered = False

    # --- the run ---------------------------------------------------------------------------------

    async def state(self, client: httpx.AsyncClient) -> dict[str, Any] | None:
        try:
            r = await client.get(self.base + "/v1/admin/state", headers=self.headers)
        except httpx.HTTPError:
            return None
        if r.status_code == 503:
            self.shed += 1  # the controller is behind: it sheds state views first
        return dict(r.json()) if r.status_code == 200 else None

    async def events(self, client: httpx.AsyncClient) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        after = 0
        for _ in range(10_000):
            r = await client.get(
                self.base + "/v1/admin/events", params={"after": after}, headers=self.headers
            )
            body = r.json()
            out += body["events"]
            if not body["events"]:
                return out
            after = body["next"]
        return out

    async def histograms(self, client: httpx.AsyncClient) -> dict[str, dict[str, float]]:
        """The controller's histograms now: name (with its labels) -> bucket bound -> count,
        plus `count` and `sum`; empty when an overloaded controller did not answer (3 tries)."""
        for _ in range(3):
            try:
                r = await client.get(self.base + "/metrics", headers=self.headers)
            except httpx.HTTPError as e:
                print(f"  reading the controller's /metrics failed: {e!r}")
                continue
            if r.status_code == 200:
                break
            print(f"  the controller's /metrics answered {r.status_code}")
        else:
            return {}
        out: dict[str, dict[str, float]] = {}
        for family in text_string_to_metric_families(r.text):
            if family.name not in HISTOGRAMS:
                continue
            for sample in family.samples:
                labels = {k: v for k, v in sample.labels.items() if k != "le"}
                key = family.name + "".join(f"{{{k}={v}}}" for k, v in sorted(labels.items()))
                row = out.setdefault(key, {})
                if sample.name.endswith("_bucket"):
                    row[sample.labels["le"]] = sample.value
                elif sample.name.endswith("_count"):
                    row["count"] = sample.value
                elif sample.name.endswith("_sum"):
                    row["sum"] = sample.value
        return out

    async def probe_own_loop(self) -> None:
        """This process's own lateness: the fake agents' delays are in what they measure."""
        while not self.stop.is_set():
            asked = time.monotonic()
            await asyncio.sleep(0.1)
            if self.stats.measuring:
                self.stats.own_lateness_ms.append((time.monotonic() - asked - 0.1) * 1000)

    async def onboard(self, client: httpx.AsyncClient) -> None:
        sem = asyncio.Semaphore(32)

        async def one(a: Agent) -> None:
            async with sem:
                r = await client.post(
                    f"{self.base}/v1/admin/nodes/{a.node}/credential",
                    json={"agent_url": f"http://127.0.0.1:{self.agents_port}/n/{a.node}"},
                    headers=self.headers,
                )
                r.raise_for_status()
                a.token = r.json()["token"]

        await asyncio.gather(*(one(a) for a in self.agents.values()))

    async def until_ready(self, client: httpx.AsyncClient, t_start: float) -> float | None:
        while time.monotonic() - t_start < self.args.ready_deadline:
            await asyncio.sleep(2.0)
            if self.proc is not None and self.proc.poll() is not None:
                print(f"  the controller exited ({self.proc.returncode}): see controller.log")
                return None
            st = await self.state(client)
            ready = sum(1 for r in (st or {}).get("replicas", []) if r["state"] == "ready")
            print(f"  {time.monotonic() - t_start:6.1f}s ready {ready}/{self.n // 2}")
            if ready == self.n // 2:
                return time.monotonic() - t_start
        return None

    async def until_lost(self, client: httpx.AsyncClient, silenced: list[str]) -> None:
        t_silence = time.monotonic()
        while time.monotonic() - t_silence < 60 + LOST_MARGIN_S:
            await asyncio.sleep(2.0)
            st = await self.state(client)
            lost = {n["node"] for n in (st or {}).get("nodes", []) if n["state"] == "lost"}
            if set(silenced) <= lost:
                return

    async def run(self) -> dict[str, Any]:
        step(f"{self.n} nodes: starting the controller, onboarding every node")
        self.start_controller()
        self.start_neighbours()
        server = uvicorn.Server(
            uvicorn.Config(
                self.commands,
                host="127.0.0.1",
                port=self.agents_port,
                log_level="warning",
                interface="asgi3",
            )
        )
        served = asyncio.create_task(server.serve())
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            for _ in range(600):
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(self.base + "/health")).status_code == 200:
                        break
                await asyncio.sleep(0.1)
            await self.onboard(client)
            r = await client.put(
                self.base + "/v1/admin/deployments/one",
                json={"profile": "one", "replicas": self.n // 2},
                headers=self.headers,
            )
            r.raise_for_status()
            step(f"{self.n} nodes: registering, until {self.n // 2} replicas are ready")
            t_start = time.monotonic()
            tasks = [asyncio.create_task(self.agent(a)) for a in self.agents.values()]
            tasks.append(asyncio.create_task(self.probe_own_loop()))
            ready_s = await self.until_ready(client, t_start)
            if self.proc is not None and self.proc.poll() is not None:
                log = (self.workdir / "controller.log").read_text(errors="replace")
                last = [ln for ln in log.splitlines() if " CRITICAL " in ln or " ERROR " in ln]
                raise SystemExit(
                    f"the controller exited ({self.proc.returncode}) before every replica was "
                    f"ready: {last[-1] if last else 'see its log'}"
                )
            # this process's own collector stays out of the measured latencies: its heap of
            # 10,000 agents takes a full collection as long as the controller's would
            step(f"{self.n} nodes: {self.args.steady:g} s of steady state, measured")
            gc.collect()
            gc.freeze()
            gc.disable()
            before = await self.histograms(client)
            cpu0, wall0, own0 = self.cpu_s(), time.monotonic(), time.process_time()
            self.stats.measuring = True
            await asyncio.sleep(self.args.steady)
            self.stats.measuring = False
            after = await self.histograms(client)
            gc.enable()
            gc.unfreeze()
            cpu_share = (self.cpu_s() - cpu0) / (time.monotonic() - wall0)
            self.generator_share = (time.process_time() - own0) / (time.monotonic() - wall0)
            rss = self.rss_mib()
            silenced = self.rng.sample(sorted(self.agents), max(1, int(self.n * self.args.silence)))
            step(f"{self.n} nodes: {len(silenced)} silenced, until they are declared lost")
            for node in silenced:
                self.agents[node].silenced = True
            await self.until_lost(client, silenced)
            self.stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            events = await self.events(client)
        server.should_exit = True
        await served
        self.stop_controller()
        return self.result(events, silenced, ready_s, cpu_share, rss) | {
            "controller": controller_side(before, after)
        }

    def result(
        self,
        events: list[dict[str, Any]],
        silenced: list[str],
        ready_s: float | None,
        cpu_share: float,
        rss: float,
    ) -> dict[str, Any]:
        lost_by: dict[str, float] = {}
        for e in events:
            if e["kind"] == "node.lost":
                node = e["subjects"]["node"]
                # (a node that never got a heartbeat sent has no silence to measure from)
                if node in silenced and self.agents[node].last_beat_ms > 0:
                    lost_by[node] = (e["t_ms"] - self.agents[node].last_beat_ms) / 1000
        quiet = set(silenced)
        false_suspect = {
            e["subjects"]["node"]
            for e in events
            if e["kind"] == "node.suspect" and e["subjects"]["node"] not in quiet
        }
        false_lost = {
            e["subjects"]["node"]
            for e in events
            if e["kind"] == "node.lost" and e["subjects"]["node"] not in quiet
        }
        log = (self.workdir / "controller.log").read_text(errors="replace")
        lat = sorted(self.stats.latencies_ms)
        return {
            "nodes": self.n,
            "ready_s": ready_s,
            "p50_ms": statistics.median(lat) if lat else None,
            "p99_ms": lat[int(len(lat) * 0.99)] if lat else None,
            "beats": self.stats.beats,
            "failed_beats": self.stats.failed,
            "refused_beats": self.stats.refused,
            "reconnects": self.stats.reconnects,
            "failed_sends": log.count("failed:"),
            "cpu_share": cpu_share,
            "rss_mib": rss,
            "false_suspect": len(false_suspect),
            "false_lost": len(false_lost),
            "silenced": len(silenced),
            "detected": len(lost_by),
            "detect_s": (min(lost_by.values()), max(lost_by.values())) if lost_by else None,
            "events": len(events),
            "unplaceable_events": sum(1 for e in events if e["kind"] == "replica.unplaceable"),
            "lag_events": sum(1 for e in events if e["kind"] == "controller.lagged"),
            "noisy_neighbours": self.args.noisy,
            "state_views_shed": self.shed,
            "generator_cpu_share": self.generator_share,
            "generator_lateness_ms": quantiles(sorted(self.stats.own_lateness_ms)),
        }


def quantiles(values: list[float]) -> dict[str, float] | None:
    """p50, p99 and max of sorted `values`, in their unit."""
    if not values:
        return None
    return {
        "p50": round(values[len(values) // 2], 2),
        "p99": round(values[int(len(values) * 0.99)], 2),
        "max": round(values[-1], 2),
    }


def controller_side(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]
) -> dict[str, dict[str, Any]]:
    """Each controller histogram over the steady window: how many, their sum, and the bucket
    bounds (ms) under which half and 99% of them fell, with the count past 50 ms."""
    out: dict[str, dict[str, Any]] = {}
    for key, row in sorted(after.items()):
        base = before.get(key, {})
        count = row.get("count", 0.0) - base.get("count", 0.0)
        bounds = sorted(
            ((float(le), row[le] - base.get(le, 0.0)) for le in row if le not in ("count", "sum")),
            key=lambda b: b[0],
        )

        def bound(q: float, bounds: list[tuple[float, float]] = bounds, n: float = count) -> str:
            for le, cum in bounds:
                if cum >= q * n:
                    return "inf" if le == float("inf") else f"<={le * 1000:g}"
            return "-"

        over_50ms = count - next((cum for le, cum in bounds if le >= 0.05), count)
        out[key] = {
            "count": int(count),
            "sum_s": round(row.get("sum", 0.0) - base.get("sum", 0.0), 3),
            "p50_ms": bound(0.5) if count else "-",
            "p99_ms": bound(0.99) if count else "-",
            "over_50ms": int(over_50ms),
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", default="1000,2000,5000,10000")
    p.add_argument("--steady", type=float, default=120.0, help="seconds of steady state")
    p.add_argument("--silence", type=float, default=0.01, help="share of nodes silenced")
    p.add_argument("--interval", type=int, default=10, help="heartbeat interval, seconds")
    p.add_argument(
        "--noisy",
        type=int,
        default=0,
        metavar="N",
        help="N busy processes on the controller's CPU: a run past its capacity",
    )
    p.add_argument(
        "--ready-deadline",
        type=float,
        default=300.0,
        help="seconds to wait for every replica to be ready before measuring anyway",
    )
    args = p.parse_args()
    os.sched_setaffinity(0, {1})
    rows = []
    for n in (int(x) for x in args.nodes.split(",")):
        with tempfile.TemporaryDirectory(prefix="llmgw-load-") as tmp:
            print(f"{n} nodes:")
            load = Load(args, n, Path(tmp))
            try:
                row = asyncio.run(load.run())
            finally:  # whatever ended the run, the controller and its neighbours go with it
                load.stop_controller()
            print("  " + json.dumps(row))
            rows.append(row)
    print()
    print(
        "| nodes | replicas ready | heartbeat p50 / p99 | failed beats / sends | controller CPU "
        "| RSS | false suspect / lost | silenced: lost after |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        ready = f"all, {r['ready_s']:.0f} s" if r["ready_s"] is not None else "not all"
        det = r["detect_s"]
        detected = f"{r['detected']}/{r['silenced']}"
        if det:
            detected += f", {det[0]:.1f}-{det[1]:.1f} s"
        print(
            f"| {r['nodes']:,} | {ready} | {r['p50_ms']:.1f} / {r['p99_ms']:.1f} ms "
            f"| {r['failed_beats']} / {r['failed_sends']} | {r['cpu_share']:.0%} "
            f"| {r['rss_mib']:.0f} MiB | {r['false_suspect']} / {r['false_lost']} | {detected} |"
        )
    print()
    print(
        "| nodes | heartbeat p99 at the agents | in the controller: p99 (bucket), past 50 ms "
        "| its loop woken late past 50 ms | its collector's pauses past 50 ms "
        "| the agents' own loop late: p99 / max |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        c = r["controller"]
        hb = c.get("llmgw_heartbeat_handling_seconds", {})
        late = c.get("llmgw_controller_loop_lateness_seconds", {})
        pauses = sum(v["over_50ms"] for k, v in c.items() if k.startswith("llmgw_gc_pause"))
        own = r["generator_lateness_ms"] or {"p99": 0.0, "max": 0.0}
        print(
            f"| {r['nodes']:,} | {r['p99_ms']:.1f} ms | {hb.get('p99_ms', '-')} ms, "
            f"{hb.get('over_50ms', 0)} of {hb.get('count', 0):,} "
            f"| {late.get('over_50ms', 0)} of {late.get('count', 0):,} probes | {pauses} "
            f"| {own['p99']:.1f} / {own['max']:.1f} ms |"
        )


if __name__ == "__main__":
    main()
