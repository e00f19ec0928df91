"""The router's own work per request in CPU instructions, a figure the machine's load moves not.

    .venv/bin/python benchmarks/router_instructions.py [TREE ...] [--requests 400]
                                                       [--modes stream,whole]

Needs valgrind (`apt-get install valgrind`). Two sim engines and a fake controller feed are
started as in `benchmarks/router.py`; then, for each TREE (a checkout of this project, its `src`
first on `PYTHONPATH`; by default this one), an `llmgw-twin router` runs under callgrind, is sent
100 requests to warm up, has its counts zeroed (`callgrind_control -z`), is sent `--requests`
chat completions (8 in flight, 16 tokens each) and has its counts dumped. Prints the
instructions the router executed per request, a stream and a whole answer. What the kernel does
for its system calls is not counted; the timings in `benchmarks/router.py` include it. Repeated
runs agree within a few percent (how many reads an answer takes varies).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_progress import step
from router import MODEL, Procs, feed_server, free_port, run_cell, wait_until

HERE = Path(__file__).resolve().parent.parent
IN_FLIGHT = 8
WARM_UP = 100


def counted(out: Path) -> int:
    """The instructions in callgrind's newest dump under `out`."""
    newest = max(glob.glob(f"{out}.*"), key=os.path.getmtime)
    for line in Path(newest).read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise SystemExit(f"no totals in {newest}")


def measure(tree: Path, feed_port: int, tmp: Path, modes: list[str], requests: int) -> list[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = tmp / f"router-{port}.yaml"
    config.write_text(
        f"listen: {{host: 127.0.0.1, port: {port}}}\n"
        f"controller: http://127.0.0.1:{feed_port}\n"
        "limits: {max_outstanding_per_replica: 256}\n"
    )
    out = tmp / f"callgrind-{port}"
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    launch = [sys.executable, "-m", "llmgw_twin.cli", "router", "--config", str(config)]
    with (tmp / f"router-{port}.log").open("wb") as log:
        router = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p", *launch],
            env=env,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    rows = []
    try:
        step(f"{tree}: a router under callgrind")
        wait_until(
            lambda c: (
                [m["ready_replicas"] for m in c.get(url + "/v1/models").json()["data"]] == [2]
            ),
            f"the router of {tree}",
        )
        for mode in modes:
            stream = mode == "stream"
            step(f"{tree}: {mode}, {requests} requests")
            asyncio.run(run_cell([url], IN_FLIGHT, WARM_UP, 120, stream, 16))
            control = ("callgrind_control", str(router.pid))
            subprocess.run([control[0], "-z", control[1]], check=True, capture_output=True)
            cell = asyncio.run(run_cell([url], IN_FLIGHT, requests, 300, stream, 16))
            subprocess.run([control[0], "-d", control[1]], check=True, capture_output=True)
            time.sleep(0.5)  # the dump is written by the router as it goes on
            done = len(cell.latencies_s)
            per = counted(out) / max(1, done)
            rows.append(f"| {tree} | {mode} | {done} | {cell.failed} | {per / 1000:,.0f}k |")
    finally:
        stop(router)
    return rows


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop a process this started, by its group (its own session)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("trees", nargs="*", type=Path, default=[HERE])
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--modes", default="stream,whole")
    args = p.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        p.error("needs valgrind (apt-get install valgrind)")
    for tree in args.trees:
        if not (tree / "src" / "llmgw_twin").is_dir():
            p.error(f"{tree}: not a checkout of this project (no src/llmgw_twin)")
    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in ("stream", "whole") for m in modes):
        p.error("--modes: stream, whole or both")
    with tempfile.TemporaryDirectory(prefix="router-instructions-") as name:
        tmp = Path(name)
        procs = Procs(tmp)
        feed = None
        try:
            step("starting 2 sim engines")
            ports = [free_port() for _ in range(2)]
            engines = [f"http://127.0.0.1:{port}" for port in ports]
            for i, port in enumerate(ports):
                procs.start(
                    f"engine{i}",
                    *("sim-engine", "--model", f"/models/{MODEL}", "--served-model-name", MODEL),
                    *("--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"),
                )
            for url in engines:
                wait_until(lambda c, u=url: c.get(u + "/health").status_code == 200, url)
            feed = feed_server(engines)
            rows = []
            for tree in args.trees:
                rows += measure(tree.resolve(), feed.server_address[1], tmp, modes, args.requests)
        finally:
            procs.close()
            if feed is not None:
                feed.shutdown()
    print(f"{IN_FLIGHT} in flight, 16 tokens per answer, counted after {WARM_UP} to warm up\n")
    print("| tree | answer | requests | failed | instructions per request |")
    print("| --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
