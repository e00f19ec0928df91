"""The twin's fidelity over the whole suite: every scenario file on real processes, against the
twin on the same scaled file.

    .venv/bin/python benchmarks/real_fidelity.py [--jobs 2] [--time-scale 0.1] [FILE...]
    .venv/bin/python benchmarks/real_fidelity.py --reports DIR


Runs `llmgw-twin run --real --compare --json FILE` for each file (default: every file in
`scenarios/`), `--jobs` at a time, each in a temporary folder of its own (the runs keep apart:
`docs/real-mode.md`), each bounded by `--max-seconds`. Prints one markdown table, a row per
file: whether the real run passed, whether both made the same control decisions (per replica
and node), and, per event expectation, the twin's virtual time, the real time and the
difference of the first matching event inside the window ("none" when no event falls in it);
then the differences in decisions, file by file. Progress goes to stderr. Exit status 0 when
every file passed with the same decisions, 1 otherwise.

With `--reports DIR` nothing runs: the table is made of the JSON reports the real-suite test
wrote there (`LLMGW_REAL_REPORTS=DIR make test-real`).

The runs share this machine's cores: more jobs finish sooner and judge harsher (processes start
slower when the cores are busy, and the tolerance is the same).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def run_one(path: Path, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="llmgw-fidelity-") as tmp:
        argv = [sys.executable, "-m", "llmgw_twin.cli", "run", "--real", "--compare", "--json"]
        argv += ["--time-scale", str(args.time_scale), str(path)]
        started = time.monotonic()
        try:
            done = subprocess.run(  # our own interpreter, a fixed argv
                argv,
                capture_output=True,
                text=True,
                timeout=args.max_seconds,
                env={**os.environ, "TMPDIR": tmp},
                check=False,
            )
        except subprocess.TimeoutExpired:
            return {"file": path.stem, "error": f"not done within {args.max_seconds} s"}
        wall = time.monotonic() - started
    try:
        report: dict[str, Any] = json.loads(done.stdout)
    except ValueError:
        tail = done.stderr.strip().splitlines()[-3:]
        return {"file": path.stem, "error": f"exit {done.returncode}: {' / '.join(tail)}"}
    report["file"], report["wall_s"] = path.stem, wall
    return report


def _cell(ms: int | None) -> str:
    return "none" if ms is None else f"{ms / 1000:.2f}s"


def table(reports: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| scenario | real run | same decisions | event expectations: twin / real / real-twin |",
        "| --- | --- | --- | --- |",
    ]
    for r in reports:
        if "error" in r:
            lines.append(f"| {r['file']} | error: {r['error']} | - | - |")
            continue
        fid = r.get("fidelity", {})
        cells = []
        for row in fid.get("rows", []):
            twin, real = row.get("virtual_ms"), row.get("real_ms")
            diff = f"{(real - twin) / 1000:+.2f}s" if twin is not None and real is not None else "-"
            cells.append(f"{_cell(twin)} / {_cell(real)} / {diff}")
        failed = sum(1 for e in r["expectations"] if not e["passed"])
        verdict = "pass" if r["passed"] else f"FAIL ({failed} expectation(s))"
        same = "yes" if fid.get("same_decisions") else "no"
        lines.append(f"| {r['file']} | {verdict} | {same} | {'; '.join(cells) or '-'} |")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="*", type=Path)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--time-scale", type=float, default=0.1)
    p.add_argument("--max-seconds", type=float, default=420.0)
    p.add_argument("--reports", type=Path, help="make the table of the reports in this folder")
    args = p.parse_args()
    files = args.files or sorted((ROOT / "scenarios").glob("*.yaml"))
    reports: list[dict[str, Any]] = []
    if args.reports is not None:
        reports = [json.loads(f.read_text()) for f in sorted(args.reports.glob("*.json"))]
    else:
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            for report in pool.map(lambda f: run_one(f, args), files):
                reports.append(report)
                print(f"{len(reports)}/{len(files)} {report['file']}", file=sys.stderr, flush=True)
    print("\n".join(table(reports)))
    for r in reports:
        for line in r.get("fidelity", {}).get("differences", []):
            print(f"- {r['file']}: {line}")
    good = all(
        "error" not in r and r["passed"] and r.get("fidelity", {}).get("same_decisions")
        for r in reports
    )
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
