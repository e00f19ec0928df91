"""`llmgw-twin sim-engine`: one shard of the project's sim engine, as a real process.

The argv is the one `engines/sim.py` builds. Rank 0, the leader, binds the rendezvous port
(`--rendezvous HOST:PORT`), waits until every worker (ranks 1..N-1) has joined and its own load
time has passed, and only then opens its HTTP port and serves the OpenAI-compatible API of
`sim_api`. A worker dials the leader's rendezvous port, joins, and stays connected; it opens no
listening port at all. The protocol is in `sim_rendezvous`.

Invariants:
- The leader's HTTP port is closed until the replica is whole: connecting to it before every
  worker joined is refused, so "the port answers" means "the replica serves".
- A replica is whole only while every connection holds. A leader that loses a worker stops
  serving (it closes its HTTP port, drops the other workers) and exits 1; a worker whose leader
  goes away without saying `shutdown` exits 1; each `PEER_LOSS_NOTICE_S` after the connection
  ended, as a collective notices a dead peer at its next step (`sim_rendezvous`). Nothing is
  re-joined: a broken replica is replaced, not repaired, as the controller expects.
- The load time counts from the process's start (`process_age_s`), as a real engine's load
  includes its own start-up: the interpreter and the web stack's imports are part of it, not
  added to it, so a shard serves `--load-time-ms` after it was launched however busy the machine
  is (unless starting alone takes longer).
- With `--pace-file` (`sim_pace`), the node's pace when the process started scales its load
  time, and a request the leader accepts is served at the replica's pace then: the slowest of
  its own node's and its workers' (each worker tells its leader, `sim_rendezvous`), as the twin's
  straggler (`slow_node`). A worker with `--ready-file` writes that file once it has loaded and
  joined: its agent reads it ready by it (a worker opens no port), so a replica is ready only
  once its slowest shard has loaded, as in the twin, while its leader serves on its own load.
- SIGTERM or SIGINT stops a shard cleanly with exit 0; a leader tells its workers `shutdown`
  first, so they exit 0 as well.
- Every wait is bounded: joins by `--join-timeout-ms` (exit 3), shutdown by uvicorn's graceful
  timeout.

Exit status: 0 clean stop; 1 a peer was lost; 2 bad configuration (flags, a refused join, an
HTTP port that cannot be bound); 3 the rendezvous did not complete in time.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from llmgw_twin.engines.perf.model import EnginePerf
from llmgw_twin.engines.perf.table import perf_from_arg
from llmgw_twin.programs.sim_pace import ONE, PaceFile, boottime_ns, slowed_ms
from llmgw_twin.programs.sim_pacing import replica_pace
from llmgw_twin.programs.sim_rendezvous import LeaderRendezvous, parse_endpoint
from llmgw_twin.programs.sim_tasks import Tasks, stop_on_signals

EXIT_OK, EXIT_PEER_LOST, EXIT_CONFIG, EXIT_JOIN_TIMEOUT = 0, 1, 2, 3
DEFAULT_JOIN_TIMEOUT_MS = 600_000
GRACEFUL_SHUTDOWN_S = 2

log = logging.getLogger("llmgw_twin.sim_engine")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model_path: str
    served_name: str
    nnodes: int
    rank: int
    rendezvous: tuple[str, int] | None
    rendezvous_bind: str | None
    load_time_ms: int
    host: str
    port: int
    token_latency_ms: int
    max_tokens_default: int
    join_timeout_ms: int
    log_level: str
    perf_model: EnginePerf | None = None
    source_host: str | None = None
    """A worker's connection to its leader leaves from this address (None: the system's)."""
    pace_file: str | None = None
    """The node's pace file (`sim_pace`); None: this engine always runs at pace 1."""
    ready_file: str | None = None
    """A worker writes this file once it has loaded and joined (None: it writes none)."""


def process_age_s() -> float:
    """How long ago this process started (from /proc, to the clock tick); 0 where unreadable."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        started_s = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started_s)
    except (OSError, ValueError, IndexError):
        return 0.0


def start_pace(pace: PaceFile | None) -> Fraction:
    """The node's pace when this process started (1 without a pace file). /proc gives the start
    in whole clock ticks, rounded down: the tick's end is taken, so a change made just before
    the process started counts for it (one made within a tick after it would too)."""
    if pace is None:
        return ONE
    now_ns = boottime_ns()
    tick_ns = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    return pace.at(min(now_ns, now_ns - int(process_age_s() * 1e9) + tick_ns))


async def _load(cfg: EngineConfig, pace: Fraction = ONE) -> int:
    """The simulated load at `pace` (the node's at the process's start): whatever of the load
    time the process's start-up left. Returns the load time it took, in ms."""
    load_ms = slowed_ms(cfg.load_time_ms, pace)
    await asyncio.sleep(max(0.0, load_ms / 1000 - process_age_s()))
    return load_ms


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _endpoint(text: str) -> tuple[str, int]:
    try:
        return parse_endpoint(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _perf(text: str) -> EnginePerf:
    try:
        return perf_from_arg(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="model path (reported, never read)")
    parser.add_argument(
        "--served-model-name", help="the model's name in the API (default: --model)"
    )
    parser.add_argument("--nnodes", type=_positive, default=1, help="shards in the replica")
    parser.add_argument("--node-rank", type=_non_negative, default=0, help="0 is the leader")
    parser.add_argument(
        "--rendezvous",
        type=_endpoint,
        metavar="HOST:PORT",
        help="the leader's rendezvous address; the leader binds it, workers dial it "
        "(required when --nnodes > 1)",
    )
    parser.add_argument(
        "--rendezvous-bind",
        metavar="HOST",
        help="leader only: the address its rendezvous port binds (default: --rendezvous's host)",
    )
    parser.add_argument(
        "--source-host",
        metavar="HOST",
        help="workers only: the address their connection to the leader leaves from (the "
        "node's own; default: the system's choice)",
    )
    parser.add_argument(
        "--load-time-ms",
        type=_non_negative,
        default=0,
        help="simulated load, counted from the process's start",
    )
    parser.add_argument(
        "--pace-file",
        metavar="PATH",
        help="the node's pace file (set by the agent): the load time is scaled by the pace at "
        "the process's start, each request by the replica's slowest node's pace when it is "
        "accepted (default: pace 1)",
    )
    parser.add_argument(
        "--ready-file",
        metavar="PATH",
        help="workers only (set by the agent): write this file once loaded and joined",
    )
    parser.add_argument("--host", default="0.0.0.0", help="leader only: HTTP address")  # noqa: S104
    parser.add_argument("--port", type=_positive, default=8000, help="leader only: HTTP port")
    parser.add_argument(
        "--token-latency-ms", type=_non_negative, default=0, help="wall time per generated token"
    )
    parser.add_argument(
        "--perf-model",
        type=_perf,
        metavar="ENTRY|FIELD=VALUE,...",
        help="leader only: answer through the twin's engine model (continuous batching, a KV "
        "cache that queues) with an entry of engines/perf/table.py or every field "
        "(iteration_us=...,prefill_us_per_token=...,decode_us_per_token=...,max_batch=...,"
        "kv_tokens=...); --token-latency-ms is then not used",
    )
    parser.add_argument(
        "--max-tokens-default",
        type=_non_negative,
        default=256,
        help="token cap for requests that set none",
    )
    parser.add_argument(
        "--join-timeout-ms",
        type=_positive,
        default=DEFAULT_JOIN_TIMEOUT_MS,
        help="leader: how long to wait for every worker; worker: how long to dial the leader",
    )
    parser.add_argument(
        "--log-level", choices=("debug", "info", "warning", "error"), default="info"
    )


def _config(args: argparse.Namespace) -> EngineConfig:
    if args.node_rank >= args.nnodes:
        raise ValueError(f"--node-rank {args.node_rank} is not below --nnodes {args.nnodes}")
    if args.nnodes > 1 and args.rendezvous is None:
        raise ValueError("--rendezvous HOST:PORT is required when --nnodes > 1")
    return EngineConfig(
        model_path=args.model,
        served_name=args.served_model_name or args.model,
        nnodes=args.nnodes,
        rank=args.node_rank,
        rendezvous=args.rendezvous,
        rendezvous_bind=args.rendezvous_bind,
        source_host=args.source_host,
        load_time_ms=args.load_time_ms,
        host=args.host,
        port=args.port,
        token_latency_ms=args.token_latency_ms,
        max_tokens_default=args.max_tokens_default,
        join_timeout_ms=args.join_timeout_ms,
        log_level=args.log_level,
        perf_model=args.perf_model,
        pace_file=args.pace_file,
        ready_file=args.ready_file,
    )


def main(args: argparse.Namespace) -> int:
    try:
        cfg = _config(args)
    except ValueError as e:
        print(f"sim-engine: error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    logging.basicConfig(
        level=cfg.log_level.upper(),
        format=f"%(asctime)s sim-engine rank {cfg.rank}/{cfg.nnodes} %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    if cfg.rank == 0:
        run = run_leader(cfg)
    else:
        from llmgw_twin.programs.sim_worker import run_worker  # the leader never needs it

        run = run_worker(cfg)
    code = asyncio.run(run)
    # Everything is closed and said: skip the interpreter's teardown of the web stack (a tenth
    # of a second, several on busy cores), which would only delay the agent's next shard on
    # these GPUs. Nothing is left to flush but the log and the standard streams.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto named: asyncio sets TCP_NODELAY on accepted connections only for an IPPROTO_TCP
    # socket, and without it a kept-alive client waits ~40 ms (a delayed ACK) for each answer
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return sock


async def run_leader(cfg: EngineConfig) -> int:
    # The web stack is imported now, while workers start, not after they joined; workers never
    # import it at all.
    from llmgw_twin.programs import sim_api  # noqa: F401

    loop = asyncio.get_running_loop()
    stop = stop_on_signals()
    rdv = LeaderRendezvous(cfg.nnodes, cfg.served_name)
    if cfg.nnodes == 1:
        rdv.all_joined.set()
    else:
        assert cfg.rendezvous is not None
        host, port = cfg.rendezvous
        host = cfg.rendezvous_bind or host
        try:
            await rdv.start(host, port)
        except OSError as e:
            log.error("cannot bind the rendezvous port %s:%d: %s", host, port, e)
            return EXIT_CONFIG
        log.info("rendezvous listening on %s:%d, waiting for ranks %s", host, port, rdv.waiting_for)
    tasks = Tasks()
    try:
        return await _lead(cfg, loop, stop, rdv, tasks)
    finally:
        await tasks.cancel_all()


async def _lead(
    cfg: EngineConfig,
    loop: asyncio.AbstractEventLoop,
    stop: asyncio.Event,
    rdv: LeaderRendezvous,
    tasks: Tasks,
) -> int:
    join_deadline = loop.time() + cfg.join_timeout_ms / 1000
    pace = PaceFile(cfg.pace_file) if cfg.pace_file is not None else None
    tasks.add("load", _load(cfg, start_pace(pace)))
    tasks.add("join", rdv.all_joined.wait())
    tasks.add("stop", stop.wait())
    tasks.add("lost", rdv.lost.wait())
    while "load" in tasks or "join" in tasks:
        timeout = max(0.0, join_deadline - loop.time()) if "join" in tasks else None
        finished = await tasks.next(timeout)
        if not finished:
            log.error("rendezvous timed out: ranks %s never joined", rdv.waiting_for)
            await rdv.close(clean=False)
            return EXIT_JOIN_TIMEOUT
        for name, task in finished:
            if name == "stop":
                log.info("stopping before serving")
                await rdv.close(clean=True)
                return EXIT_OK
            if name == "lost":
                log.error("rank %s left before the replica served", rdv.lost_rank)
                await rdv.close(clean=False)
                return EXIT_PEER_LOST
            if name == "load":
                log.info("loaded in %d ms", task.result())
            if name == "join" and cfg.nnodes > 1:
                log.info("all %d workers joined", cfg.nnodes - 1)
    return await _serve(cfg, rdv, tasks, replica_pace(pace, rdv))


async def _serve(
    cfg: EngineConfig,
    rdv: LeaderRendezvous,
    tasks: Tasks,
    pace: Callable[[], Fraction] | None = None,
) -> int:
    from llmgw_twin.programs.sim_api import SimModel, http_server

    try:
        sock = _listen(cfg.host, cfg.port)
    except OSError as e:
        log.error("cannot bind the HTTP port %s:%d: %s", cfg.host, cfg.port, e)
        await rdv.close(clean=False)
        return EXIT_CONFIG
    from llmgw_twin.programs.sim_batcher import Batcher

    batcher = None if cfg.perf_model is None else Batcher(cfg.perf_model, pace=pace)
    sim = SimModel(
        cfg.served_name,
        cfg.model_path,
        cfg.token_latency_ms,
        cfg.max_tokens_default,
        batcher=batcher,
        pace=pace,
    )
    server = http_server(sim, cfg.log_level, GRACEFUL_SHUTDOWN_S)
    serving = tasks.add("serve", server.serve(sockets=[sock]))
    rdv.broadcast("serving")
    log.info("serving %s on http://%s:%d", cfg.served_name, cfg.host, cfg.port)
    finished = [name for name, _ in await tasks.next()]
    code = EXIT_OK
    if "lost" in finished:
        log.error("rank %s was lost: the replica is broken, no longer serving", rdv.lost_rank)
        code = EXIT_PEER_LOST
    elif "serve" in finished:
        log.error("the HTTP server stopped on its own")
        code = EXIT_PEER_LOST
    else:
        log.info("stopping")
    # Stop HTTP first: no request may be answered by a replica that is no longer whole.
    server.stop()
    await asyncio.wait([serving])  # bounded by uvicorn's graceful-shutdown timeout
    sock.close()
    await rdv.close(clean=code == EXIT_OK)
    return code
