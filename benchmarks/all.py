"""Every benchmark of benchmarks/, its figures written into docs/performance.md, and the goals
judged: `make bench`.

    .venv/bin/python benchmarks/all.py [--long] [--only NAME,...] [--dry-run] [--list]

Runs each benchmark of `BENCHES` as its own process, with the modest sizes given there (the
whole default set takes a few minutes on two cores; `--long` adds the 10,000-node twin runs,
the production controller under load and the real-mode fidelity suite, tens of minutes). Each
one's standard output replaces what stands between its markers in docs/performance.md
(`<!-- bench:NAME -->` ... `<!-- /bench:NAME -->`), after the command that produced it, the
commit (`git rev-parse`, and whether the tree had uncommitted changes), the time, the machine's
load (`os.getloadavg`) and its CPU count. The goals (issue 30's "Done when") are judged from
the figures of this run and written as a table between `<!-- bench:goals -->` markers.

Exit status: 0 when every benchmark ran and every goal it measured is met; 1 when a goal was
missed or a benchmark failed (each is named on stderr); 2 for a usage mistake (an unknown name,
a marker missing in the doc). A goal whose benchmark did not run (`--only`, or a long one
without `--long`) is shown as not measured and fails nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "performance.md"
PYTHON = ".venv/bin/python"
"""How the commands are written in the doc (they run with this interpreter, `sys.executable`)."""


@dataclass(frozen=True)
class Bench:
    name: str
    """The marker's name in the doc."""
    argv: tuple[str, ...]
    """The script (relative to the repository root) and its arguments, as the doc shows them."""
    timeout_s: float
    long: bool = False
    json: bool = False
    """The script takes `--json FILE` and writes its figures there for the goals."""


BENCHES: tuple[Bench, ...] = (
    Bench("startup", ("benchmarks/startup.py", "--runs", "5"), 120, json=True),
    Bench(
        "twin",
        (
            "benchmarks/twin.py",
            "--nodes",
            "1000",
            "--virtual",
            "1h,24h",
            "--repeats",
            "3",
            "--budget",
            "60",
        ),
        600,
        json=True,
    ),
    Bench(
        "twin-10k",
        (
            "benchmarks/twin.py",
            "--nodes",
            "10000",
            "--virtual",
            "1h,24h",
            "--repeats",
            "1",
            "--budget",
            "900",
            "--no-baseline",
        ),
        1200,
        long=True,
        json=True,
    ),
    Bench(
        "router",
        (
            "benchmarks/router.py",
            *("--concurrency", "1,8", "--requests", "1500", "--rounds", "3", "--clients", "2"),
        ),
        600,
    ),
    Bench(
        "core-steps", ("benchmarks/core_steps.py", "--nodes", "1000", "4000", "--runs", "3"), 300
    ),
    Bench("placement", ("benchmarks/placement.py", "--repeats", "3", "--instances", "100"), 600),
    Bench("failover", ("benchmarks/failover.py", "--nodes", "1000"), 300),
    Bench("fleet", ("benchmarks/fleet.py", "--nodes", "1000", "--minutes", "10"), 300),
    Bench("fuzz", ("benchmarks/fuzz.py", "--seeds", "1..100", "--jobs", "1", "--no-ray"), 600),
    Bench(
        "load", ("benchmarks/load.py", "--nodes", "1000,10000", "--steady", "60"), 1800, long=True
    ),
    Bench("real-fidelity", ("benchmarks/real_fidelity.py", "--jobs", "2"), 3600, long=True),
)


@dataclass
class Run:
    bench: Bench
    rc: int | None
    """None: it ran past its timeout."""
    stdout: str
    stderr: str
    seconds: float
    load: tuple[float, float, float]
    figures: dict[str, object] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.rc == 0


@dataclass(frozen=True)
class Goal:
    name: str
    bench: str
    limit: str
    judge: Callable[[dict[str, Run]], tuple[str, bool]]
    """(what was measured, whether it meets the limit), from the runs of this run."""


def command(bench: Bench) -> str:
    return " ".join((PYTHON, *bench.argv))


def run_bench(bench: Bench) -> Run:
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        figures_path = Path(tmp) / "figures.json"
        argv = [sys.executable, *bench.argv]
        if bench.json:
            argv += ["--json", str(figures_path)]
        start = time.perf_counter()
        try:
            done = subprocess.run(
                argv,
                check=False,
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=bench.timeout_s,
            )
            rc: int | None = done.returncode
            stdout, stderr = done.stdout, done.stderr
        except subprocess.TimeoutExpired as e:
            rc = None
            stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            stderr = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        seconds = time.perf_counter() - start
        figures: dict[str, object] = {}
        if rc == 0 and bench.json and figures_path.exists():
            figures = json.loads(figures_path.read_text())
    return Run(bench, rc, stdout, stderr, seconds, load, figures)


# --- the goals -------------------------------------------------------------------------------


def markdown_rows(text: str) -> list[dict[str, str]]:
    """The rows of every markdown table in `text`, each keyed by its table's header."""
    rows: list[dict[str, str]] = []
    header: list[str] | None = None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif not all(set(c) <= set("-: ") for c in cells):
            rows.append(dict(zip(header, cells, strict=False)))
    return rows


def fleet_row(run: Run, nodes: int, virtual_ms: int) -> dict[str, object]:
    rows = run.figures.get("fleet", [])
    assert isinstance(rows, list)
    for row in rows:
        if row.get("nodes") == nodes and row.get("virtual_ms") == virtual_ms:
            if row.get("skipped"):
                raise LookupError(f"{nodes} nodes for {virtual_ms // 3_600_000} h was skipped")
            return dict(row)
    raise LookupError(f"no row for {nodes} nodes, {virtual_ms // 3_600_000} h")


HOUR_MS, DAY_MS = 3_600_000, 86_400_000


def day_over_hour(runs: dict[str, Run]) -> tuple[str, bool]:
    hour = float(fleet_row(runs["twin"], 1000, HOUR_MS)["twin_min_s"])  # type: ignore[arg-type]
    day = float(fleet_row(runs["twin"], 1000, DAY_MS)["twin_min_s"])  # type: ignore[arg-type]
    ratio = day / hour
    return f"x{ratio:.1f} (hour {hour:.2f} s, day {day:.2f} s)", ratio <= 2.0


def hour_over_bare(runs: dict[str, Run]) -> tuple[str, bool]:
    row = fleet_row(runs["twin"], 1000, HOUR_MS)
    twin, bare = float(row["twin_min_s"]), float(row["bare_min_s"])  # type: ignore[arg-type]
    ratio = twin / bare
    return f"{ratio:.2f} (twin {twin:.2f} s, bare SimPy {bare:.2f} s)", ratio <= 0.5


def big_twin(virtual_ms: int, limit_s: float) -> Callable[[dict[str, Run]], tuple[str, bool]]:
    def judge(runs: dict[str, Run]) -> tuple[str, bool]:
        row = fleet_row(runs["twin-10k"], 10000, virtual_ms)
        took = float(row["twin_min_s"])  # type: ignore[arg-type]
        return f"{took:.2f} s", took < limit_s

    return judge


def startup(runs: dict[str, Run]) -> tuple[str, bool]:
    ratio = float(runs["startup"].figures["ratio_of_medians"])  # type: ignore[arg-type]
    return f"x{ratio:.1f} of a bare `python -c pass`", ratio <= 25.0


def router_rows(runs: dict[str, Run]) -> list[dict[str, str]]:
    rows = [r for r in markdown_rows(runs["router"].stdout) if r.get("in flight") in ("1", "8")]
    if not rows:
        raise LookupError("the router's table has no row at 1 or 8 in flight")
    return rows


def router_added(runs: dict[str, Run]) -> tuple[str, bool]:
    seen = []
    met = True
    for row in router_rows(runs):
        added = float(row["added p50 / p99"].split("/")[0].strip())
        seen.append(f"{row['answer']} at {row['in flight']}: {added:+.1f} ms")
        met = met and added < 1.0
    return ", ".join(seen), met


def router_rate(runs: dict[str, Run]) -> tuple[str, bool]:
    seen = []
    met = True
    for row in router_rows(runs):
        ratio = float(row["router / direct"])
        seen.append(f"{row['answer']} at {row['in flight']}: {ratio:.2f}")
        met = met and ratio >= 0.8
    return ", ".join(seen), met


GOALS: tuple[Goal, ...] = (
    Goal("a 1,000-node day against its hour", "twin", "at most x2", day_over_hour),
    Goal("a 1,000-node hour against bare SimPy", "twin", "at most 0.5", hour_over_bare),
    Goal("a 10,000-node hour", "twin-10k", "under 8 s", big_twin(HOUR_MS, 8.0)),
    Goal("a 10,000-node day", "twin-10k", "under 60 s", big_twin(DAY_MS, 60.0)),
    Goal("`run scenarios/node-loss.yaml`, whole process", "startup", "at most x25", startup),
    Goal("the router's added p50, 1 and 8 in flight", "router", "under 1 ms", router_added),
    Goal("the router's throughput, 1 and 8 in flight", "router", "at least 0.8", router_rate),
)


def judge_goals(runs: dict[str, Run]) -> list[tuple[Goal, str, bool | None]]:
    """Each goal with what was measured and whether it is met (None: not measured here)."""
    judged: list[tuple[Goal, str, bool | None]] = []
    for goal in GOALS:
        run = runs.get(goal.bench)
        if run is None:
            judged.append((goal, "not run", None))
        elif not run.ok:
            judged.append((goal, "its benchmark failed", False))
        else:
            try:
                measured, met = goal.judge(runs)
            except (LookupError, ValueError, TypeError) as e:
                judged.append((goal, f"not readable: {e}", False))
            else:
                judged.append((goal, measured, met))
    return judged


# --- the doc ---------------------------------------------------------------------------------


def markers(name: str) -> tuple[str, str]:
    return f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"


def replace_block(doc: str, name: str, body: str) -> str:
    """`doc` with what stands between `name`'s markers replaced by `body`."""
    begin, end = markers(name)
    start, stop = doc.find(begin), doc.find(end)
    if start < 0 or stop < start or doc.count(begin) != 1 or doc.count(end) != 1:
        raise KeyError(f"docs/performance.md needs one {begin} ... {end} pair")
    return doc[: start + len(begin)] + "\n" + body.strip("\n") + "\n" + doc[stop:]


def commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()

    head = git("rev-parse", "--short=12", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return f"{head} (with uncommitted changes)" if dirty else head


def stamp(seconds: float, load: tuple[float, float, float], at_commit: str) -> str:
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    loads = " / ".join(f"{x:.2f}" for x in load)
    return (
        f"Written by `make bench` (`benchmarks/all.py`) at commit {at_commit}, {when}; load "
        f"{loads} (1, 5, 15 min) on {os.cpu_count()} CPUs when it started; it took "
        f"{seconds:.0f} s."
    )


def render(run: Run, at_commit: str) -> str:
    parts = ["```sh", command(run.bench), "```", "", stamp(run.seconds, run.load, at_commit), ""]
    if not run.ok:
        why = "ran past its timeout" if run.rc is None else f"exited {run.rc}"
        tail = "\n".join(run.stderr.strip().splitlines()[-8:])
        parts += [f"**This run failed** ({why}); no figures. The end of its stderr:", ""]
        parts += ["```text", tail, "```"]
        return "\n".join(parts)
    out = run.stdout.strip("\n")
    if any(line.startswith("|") for line in out.splitlines()):
        parts.append(out)
    else:
        parts += ["```text", out, "```"]
    return "\n".join(parts)


GOALS_HEADER = "| goal | limit | measured | met | benchmark | when |"


def render_goals(
    judged: list[tuple[Goal, str, bool | None]], at_commit: str, before: str = ""
) -> str:
    """The goals table. A goal not measured in this run keeps its row of `before` (the
    block as it stood), which says when it was measured."""
    loads = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    kept = {
        row["goal"]: row
        for row in markdown_rows(before)
        if "goal" in row and row.get("when") and row.get("met") != "not measured"
    }
    lines = [
        "```sh",
        "make bench            # .venv/bin/python benchmarks/all.py",
        "```",
        "",
        f"Judged last at commit {at_commit}, {when}; load {loads} (1, 5, 15 min) on "
        f"{os.cpu_count()} CPUs at the end. A goal whose benchmark did not run then keeps the "
        "row of the run that measured it.",
        "",
        GOALS_HEADER,
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for goal, measured, met in judged:
        old = kept.get(goal.name)
        if met is None and old is not None:
            cells = [old.get(k, "") for k in ("goal", "limit", "measured", "met", "benchmark")]
            lines.append("| " + " | ".join([*cells, old["when"]]) + " |")
            continue
        verdict = {True: "yes", False: "**no**", None: "not measured"}[met]
        stamp = "" if met is None else f"{at_commit.split(maxsplit=1)[0]}, {when}"
        lines.append(
            f"| {goal.name} | {goal.limit} | {measured} | {verdict} | {goal.bench} | {stamp} |"
        )
    return "\n".join(lines)


def block(doc: str, name: str) -> str:
    begin, end = markers(name)
    return doc[doc.index(begin) + len(begin) : doc.index(end)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--long", action="store_true", help="add the long benchmarks")
    parser.add_argument("--only", help="these benchmarks only, by name, comma-separated")
    parser.add_argument("--dry-run", action="store_true", help="write nothing to the doc")
    parser.add_argument("--list", action="store_true", help="name the benchmarks and stop")
    args = parser.parse_args(argv)
    if args.list:
        for b in BENCHES:
            print(f"{b.name:<14} {'long ' if b.long else '     '} {command(b)}")
        return 0
    chosen = [b for b in BENCHES if args.long or not b.long]
    if args.only:
        names = args.only.split(",")
        unknown = sorted(set(names) - {b.name for b in BENCHES})
        if unknown:
            print(f"unknown benchmark(s): {', '.join(unknown)}", file=sys.stderr)
            return 2
        chosen = [b for b in BENCHES if b.name in names]
    doc = DOC.read_text()
    try:  # every marker is there before minutes are spent
        for name in ["goals", *(b.name for b in chosen)]:
            replace_block(doc, name, "")
    except KeyError as e:
        print(e.args[0], file=sys.stderr)
        return 2
    at_commit = commit()
    runs: dict[str, Run] = {}
    for bench in chosen:
        print(f"[all] {bench.name}: {command(bench)}", file=sys.stderr, flush=True)
        run = run_bench(bench)
        runs[bench.name] = run
        state = "ok" if run.ok else ("timed out" if run.rc is None else f"exit {run.rc}")
        print(f"[all] {bench.name}: {state} in {run.seconds:.0f} s", file=sys.stderr, flush=True)
        doc = replace_block(doc, bench.name, render(run, at_commit))
        if not args.dry_run:
            DOC.write_text(doc)  # each figure as soon as it is measured
    judged = judge_goals(runs)
    doc = replace_block(doc, "goals", render_goals(judged, at_commit, block(doc, "goals")))
    if not args.dry_run:
        DOC.write_text(doc)
    failed = [r.bench.name for r in runs.values() if not r.ok]
    for name in failed:
        print(f"benchmark failed: {name}", file=sys.stderr)
    for goal, measured, met in judged:  # each verdict, written or not (`--dry-run`)
        if met is True:
            print(f"goal met: {goal.name}: {measured} (limit: {goal.limit})")
        elif met is False:
            print(f"goal missed: {goal.name}: {measured} (limit: {goal.limit})", file=sys.stderr)
    return 1 if failed or any(met is False for _, _, met in judged) else 0


if __name__ == "__main__":
    sys.exit(main())
