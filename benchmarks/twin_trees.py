"""The steady fleet's hour on two (or more) source trees, side by side in one run.

    .venv/bin/python benchmarks/twin_trees.py TREE [TREE ...] [--nodes 1000] [--virtual 1h]
                                              [--repeats 5] [--rounds 2]

Each TREE is a checkout of this project (a `git worktree add` of an older commit, say). For each
round, each tree in turn runs in a process of its own with its `src/` first on `sys.path`:
`benchmarks/twin.py`'s steady fleet is run once to warm up, then `--repeats` times timed, then
bare SimPy on the same heartbeat pattern as often, the garbage of what ran before collected
before each timed run (as `twin.py` does). Prints the minimum and median of each side, their
ratio, and the run's trace hash (the same in every tree when no decision changed).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

CHILD = """
import gc, statistics, sys, time
root, nodes, virtual, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
sys.path[:0] = [root + "/src", root + "/benchmarks"]
import llmgw_twin
assert llmgw_twin.__file__.startswith(root), llmgw_twin.__file__
from twin import bare_seconds, steady
from llmgw_twin.twin.world.runner import run_scenario
scenario = steady(nodes, virtual)
run_scenario(scenario)
def timed(fn):
    gc.collect()
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out
twin = [timed(lambda: run_scenario(scenario)) for _ in range(repeats)]
bare = [bare_seconds(nodes, virtual, scenario.timings, scenario.seed) for _ in range(repeats)]
t = [s for s, _ in twin]
print(f"{min(t):.3f} {statistics.median(t):.3f} {min(bare):.3f} {statistics.median(bare):.3f} "
      f"{twin[-1][1].trace_sha256[:12]}")
"""


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from llmgw_twin.units import parse_duration

    ap = argparse.ArgumentParser()
    ap.add_argument("trees", nargs="+", type=Path)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--virtual", default="1h")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    virtual = parse_duration(args.virtual)
    print(
        f"steady fleet, {args.nodes} nodes, {args.virtual} virtual, {args.repeats} timed runs "
        "a side; seconds"
    )
    print(
        f"{'round':>5} {'tree':<40} {'twin min / median':>18} {'bare min / median':>18} "
        f"{'twin/bare':>9} {'trace':>13}"
    )
    for round_no in range(1, args.rounds + 1):
        for tree in args.trees:
            root = str(tree.resolve())
            out = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    CHILD,
                    root,
                    str(args.nodes),
                    str(virtual),
                    str(args.repeats),
                ],
                capture_output=True,
                text=True,
                check=True,
                timeout=3600,
            ).stdout.split()
            tmin, tmed, bmin, bmed, trace = (
                float(out[0]),
                float(out[1]),
                float(out[2]),
                float(out[3]),
                out[4],
            )
            print(
                f"{round_no:>5} {root[-40:]:<40} {tmin:>8.3f} / {tmed:<7.3f} "
                f"{bmin:>8.3f} / {bmed:<7.3f} {tmin / bmin:>9.2f} {trace:>13}"
            )


if __name__ == "__main__":
    main()
