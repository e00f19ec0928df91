"""Fuzzer throughput: seeds per minute with local processes and with a local Ray cluster.

    .venv/bin/python benchmarks/fuzz.py [--seeds 1..1000] [--jobs 1 2] [--no-ray]

Runs the same block of seeds (`llmgw-twin fuzz` without the progress bar) once per `--jobs`
value over local processes (1: in this process), then as tasks on a Ray cluster started on this
machine, and prints, per way, the wall time, seeds per minute and the sweep digest (equal for
all: the same seeds give the same results however they ran). Ray's start-up (`ray.init`) is
timed apart; the sweep's figure is without it.
"""

from __future__ import annotations

import argparse
import logging
import os
import time

from bench_progress import step
from llmgw_twin.twin.fuzz.cli import parse_seeds, sweep
from llmgw_twin.twin.fuzz.judge import sweep_sha256


def row(label: str, wall: float, seeds: int, digest: str) -> str:
    return f"{label:<26} {wall:>8.1f} {seeds / wall * 60:>10.0f}  {digest[:16]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1..1000")
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--no-ray", action="store_true")
    args = parser.parse_args()
    seeds = parse_seeds(args.seeds)
    print(f"{len(seeds)} seeds ({args.seeds}) on {os.cpu_count()} CPUs")
    print(f"{'way':<26} {'wall s':>8} {'seeds/min':>10}  sweep sha256")
    for jobs in args.jobs:
        step(f"--jobs {jobs}: {len(seeds)} seeds")
        started = time.perf_counter()
        results = sweep(seeds, jobs=jobs)
        wall = time.perf_counter() - started
        label = "in-process (--jobs 1)" if jobs == 1 else f"processes (--jobs {jobs})"
        print(row(label, wall, len(seeds), sweep_sha256(results)))
    if args.no_ray:
        return
    import ray

    step("starting a local Ray cluster")
    started = time.perf_counter()
    ray.init(include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    init = time.perf_counter() - started
    try:
        cpus = int(ray.cluster_resources().get("CPU", 0))  # type: ignore[no-untyped-call]
        step(f"ray local ({cpus} CPUs): {len(seeds)} seeds")
        started = time.perf_counter()
        results = sweep(seeds, ray_address="local")
        wall = time.perf_counter() - started
    finally:
        ray.shutdown()
    label = f"ray local ({cpus} CPUs)"
    print(row(label, wall, len(seeds), sweep_sha256(results)))
    print(f"ray.init took {init:.1f} s (not counted above)")


if __name__ == "__main__":
    main()
