"""`llmgw-twin sweep`: one scenario over a grid of settings, several seeds each, side by side.

    llmgw-twin sweep FILE --grid KEY=V1,V2,... [--grid ...] [--seeds N] [--jobs N]
                     [--ray ADDRESS] [--plot PATH.svg] [--json]

Every grid point (`grid.py`) runs the file once per seed (the file's seed and the N-1 after
it), over local processes or a Ray cluster as the fuzzer fans out (`--jobs 1`: in this
process); each run is measured (`measure.py`) and the figures of each point are printed as a
table, and drawn with `--plot` (`plot.py`). So an operator picks timings from evidence: how
fast a loss is detected against how many false losses, at what cost in failed requests.

Exit status: 0 the sweep ran (whatever the figures), 2 bad input (nothing run).
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import yaml

from llmgw_twin.twin.fuzz.cli import ray_session
from llmgw_twin.twin.scenario.loader import ScenarioError, load_scenario, load_scenario_text
from llmgw_twin.twin.sweep.grid import GridError, Point, label, parse_axis, points, scenario_text
from llmgw_twin.twin.sweep.measure import METRICS, Measure, figures, measure
from llmgw_twin.twin.sweep.plot import svg, table
from llmgw_twin.twin.world.runner import run_scenario

MAX_SEEDS = 100


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, help="the scenario file")
    parser.add_argument(
        "--grid",
        action="append",
        required=True,
        metavar="KEY=V1,V2",
        help="a setting and its values: a timing (heartbeat_interval=1s,2s), replicas.MODEL=1,2 "
        "or rate.MODEL=5/s,10/s; repeat for more (the first varies slowest)",
    )
    parser.add_argument("--seeds", type=int, default=3, help="seeds per point (default 3)")
    parser.add_argument(
        "--jobs", type=int, default=None, help="local processes (default one per CPU)"
    )
    parser.add_argument("--ray", metavar="ADDRESS", help="run on a Ray cluster ('local': here)")
    parser.add_argument("--plot", type=Path, help="write the plot (SVG) to PATH")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")


def run_one(text: str, path: str, seed: int) -> Measure:
    """One point's scenario at one seed, measured (in a worker process or here)."""
    return measure(run_scenario(load_scenario_text(text, path), seed))


def main(args: argparse.Namespace) -> int:
    try:
        if not 1 <= args.seeds <= MAX_SEEDS:
            raise GridError(f"--seeds {args.seeds}: from 1 to {MAX_SEEDS}")
        base = load_scenario(args.file)
        data = yaml.safe_load(args.file.read_text(encoding="utf-8"))
        grid = points([parse_axis(g) for g in args.grid])
        texts = []
        for point in grid:
            text = scenario_text(data, point)
            try:
                load_scenario_text(text, f"{args.file} at {label(point)}")
            except ScenarioError as e:
                raise GridError(f"{label(point)}: {e.message}") from None
            texts.append(text)
    except (GridError, ScenarioError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    jobs = [
        (i, base.seed + s, texts[i], f"{args.file} at {label(p)}")
        for i, p in enumerate(grid)
        for s in range(args.seeds)
    ]
    print(
        f"sweep {args.file}: {len(grid)} point(s) x {args.seeds} seed(s) = {len(jobs)} runs",
        file=sys.stderr,
        flush=True,
    )
    try:
        done = _run(jobs, args.jobs, args.ray)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows = [
        (p, figures([done[(i, s)] for (j, s, _, _) in jobs if j == i])) for i, p in enumerate(grid)
    ]
    if args.json:
        print(json.dumps([_as_json(p, f) for p, f in rows], indent=2))
    else:
        print(table(rows))
    if args.plot is not None:
        title = f"{args.file}: {len(args.grid)} key(s), {args.seeds} seed(s) a point"
        try:
            args.plot.write_text(svg(rows, title), encoding="utf-8")
        except OSError as e:
            print(f"error: --plot: cannot write {args.plot}: {e.strerror or e}", file=sys.stderr)
            return 2
    return 0


def _run(
    jobs: list[tuple[int, int, str, str]], workers: int | None, ray_address: str | None
) -> dict[tuple[int, int], Measure]:
    out: dict[tuple[int, int], Measure] = {}
    total = len(jobs)
    if ray_address is not None:
        return _run_ray(jobs, ray_address)
    if workers == 1:
        for n, (i, seed, text, path) in enumerate(jobs, 1):
            out[(i, seed)] = run_one(text, path, seed)
            _progress(n, total)
        return out
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures: dict[Future[Measure], tuple[int, int]] = {
            pool.submit(run_one, text, path, seed): (i, seed) for i, seed, text, path in jobs
        }
        for n, fut in enumerate(as_completed(futures), 1):
            out[futures[fut]] = fut.result()
            _progress(n, total)
    return out


def _run_ray(jobs: list[tuple[int, int, str, str]], address: str) -> dict[tuple[int, int], Measure]:
    with ray_session(address) as ray:
        task = ray.remote(run_one)
        results = ray.get([task.remote(text, path, seed) for _, seed, text, path in jobs])
    return {(i, seed): m for (i, seed, _, _), m in zip(jobs, results, strict=True)}


def _progress(n: int, total: int) -> None:
    if n == total or n % max(10, total // 10) == 0:
        print(f"  {n}/{total} runs", file=sys.stderr, flush=True)


def _as_json(point: Point, figs: dict[str, Any]) -> dict[str, Any]:
    return {
        "point": dict(point),
        **{
            key: {
                "mean": f.mean,
                "least": f.least,
                "most": f.most,
                "seeds_without": f.missing,
            }
            for key, _ in METRICS
            for f in [figs[key]]
        },
    }
