"""A whole `llmgw-twin run` process against a bare Python process, side by side in one run.

    .venv/bin/python benchmarks/startup.py [--runs 5] [--scenario scenarios/node-loss.yaml]

Each run starts, one after the other, `python -c pass` and `llmgw-twin run -q SCENARIO` (the
console script of this interpreter's environment) as fresh processes and times each from its
start to its exit (`time.perf_counter` around `subprocess.run`, output discarded). The two
alternate, so that the machine's load falls on both alike. Prints one markdown table: min /
median / max of each, and the ratio of the medians (the process overhead of a run: imports,
loading the file, the simulation, the report). `--json FILE` writes the figures there as
well, for `benchmarks/all.py` to judge.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_progress import step

ROOT = Path(__file__).resolve().parent.parent


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def warm_up(argv: list[str]) -> None:
    """Run once untimed with the bytecode cache written, as an installed package has it (pip
    compiles a wheel's modules at install; `make` compiles an editable install's), even where
    the environment says PYTHONDONTWRITEBYTECODE: a run that compiles every module it imports is
    not what a user waits for."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run(argv, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, env=env)


def spread(runs: list[float]) -> str:
    return f"{min(runs):.3f} / {statistics.median(runs):.3f} / {max(runs):.3f} s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--scenario", default="scenarios/node-loss.yaml")
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    args = parser.parse_args()
    cli = Path(sys.executable).parent / "llmgw-twin"
    bare_argv = [sys.executable, "-c", "pass"]
    run_argv = [str(cli), "run", "-q", args.scenario]
    warm_up(run_argv)
    bare: list[float] = []
    run: list[float] = []
    for i in range(args.runs):
        step(f"run {i + 1} of {args.runs}: python -c pass, then llmgw-twin run")
        bare.append(timed(bare_argv))
        run.append(timed(run_argv))
    ratio = statistics.median(run) / statistics.median(bare)
    print(f"{args.runs} runs each, alternating\n")
    print("| process | min / median / max | median over bare |")
    print("| --- | --- | --- |")
    print(f"| `python -c pass` | {spread(bare)} | 1.0 |")
    print(f"| `llmgw-twin run -q {args.scenario}` | {spread(run)} | {ratio:.1f} |")
    if args.json is not None:
        figures = {"bare_s": bare, "run_s": run, "ratio_of_medians": ratio}
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
