"""`llmgw-twin fuzz`: sweep a block of seeds, locally, over processes, or over a Ray cluster.

    llmgw-twin fuzz --seeds A..B [--jobs N] [--ray ADDRESS] [--out DIR] [--quiet]

Each seed is one generated scenario run in the twin (`twin.fuzz`). `--jobs 1` runs them in
this process (what a test that plants a bug with monkeypatch needs); more jobs fan batches of
seeds out over a `ProcessPoolExecutor` (default: one process per CPU); `--ray ADDRESS` sends the
same batches to a Ray cluster as tasks (`--ray local` starts one on this machine). Progress
goes to stderr (`Progress`: seeds done, failures so far, ETA), never to stdout; at the end a
summary: seeds, failures, and how often each fault kind, event kind and recovery path was
exercised. Every failing seed prints the command that replays it and
its trace hash, and its shrunk scenario is written to `--out` (default ./fuzz-failures/).

Exit status: 0 no seed failed, 1 one did, 2 bad arguments.

This is the one module of the twin package that starts processes or talks to a cluster; it only
fans seeds out. Every seed still runs the deterministic twin, alone, in one process.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from llmgw_twin.twin.fuzz.judge import Coverage, SeedResult, check_batch
from llmgw_twin.units import fmt_duration

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--seeds", required=True, metavar="A..B", help="the seeds to run, both ends included"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help="local processes (default: one per CPU; 1 runs in this process)",
    )
    parser.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run the seeds as tasks on the Ray cluster at ADDRESS ('local': start one here)",
    )
    parser.add_argument(
        "--out",
        default="fuzz-failures",
        metavar="DIR",
        help="where shrunk scenarios of failing seeds go (default ./fuzz-failures/)",
    )
    parser.add_argument(
        "--quiet", "-q", action="store_true", help="no progress on stderr, one summary line"
    )


def parse_seeds(text: str) -> range:
    first, sep, last = text.partition("..")
    try:
        a = int(first)
        b = int(last) if sep else a
    except ValueError:
        raise ValueError(f"--seeds: expected A..B (e.g. 1..50), got {text!r}") from None
    if a < 0 or b < a:
        raise ValueError(f"--seeds: expected 0 <= A <= B, got {text!r}")
    return range(a, b + 1)


def batches(seeds: range, workers: int) -> list[list[int]]:
    """About eight batches per worker (balance), of at most 50 seeds (progress)."""
    size = max(1, min(50, len(seeds) // (workers * 8) or 1))
    return [list(seeds[i : i + size]) for i in range(0, len(seeds), size)]


def run_local(seeds: range, jobs: int | None) -> Iterator[list[SeedResult]]:
    if jobs == 1:
        for seed in seeds:
            yield check_batch([seed])
        return
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        # the pool's default is one process per CPU; batches are sized for up to 16 of them
        futures: list[Future[list[SeedResult]]] = [
            pool.submit(check_batch, b) for b in batches(seeds, jobs or 16)
        ]
        for done in as_completed(futures):
            yield done.result()


@contextmanager
def ray_session(address: str) -> Iterator[Any]:
    """The `ray` module, connected for the block to the cluster at `address` (`local`: one
    started here, ended after); a connection this process already had is used and kept.
    A missing package or a refused address is a `RuntimeError` in one line."""
    try:
        import ray
    except ImportError:
        raise RuntimeError(
            "--ray needs the ray package: pip install 'llmgw-twin[dev]' (or ray==2.60.0)"
        ) from None
    started_here = not ray.is_initialized()  # a caller that connected already keeps it
    if started_here:
        try:
            ray.init(
                address=None if address == "local" else address,
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.ERROR,
            )
        except (ConnectionError, ValueError) as e:
            raise RuntimeError(f"--ray {address}: {e}") from None
    try:
        yield ray
    finally:
        if started_here:
            ray.shutdown()


def run_ray(seeds: range, address: str) -> Iterator[list[SeedResult]]:
    with ray_session(address) as ray:
        resources: dict[str, float] = ray.cluster_resources()
        cpus = max(1, int(resources.get("CPU", 1)))
        task = ray.remote(check_batch)
        pending: list[Any] = [task.remote(b) for b in batches(seeds, cpus)]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                result: list[SeedResult] = ray.get(ref)
                yield result


PLAIN_EVERY_S = 10.0
"""With stderr not a terminal (a CI log, a pipe), a progress line this often at most, one at the
start and one at the end."""
TTY_FORMAT = (
    "fuzz: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} seeds{postfix} "
    "[{elapsed}<{remaining}, {rate_fmt}]"
)
LINE_FORMAT = (
    "fuzz: {n_fmt}/{total_fmt} seeds ({percentage:.0f}%){postfix}; "
    "{elapsed} elapsed, ETA {remaining}, {rate_fmt}"
)
SHOWN_FAILURES = 5
"""How many failing seeds a progress line names (the rest as "...")."""


class _Discard:
    """tqdm's file when the lines are printed here: tqdm still keeps the clock and the rate."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        return None


class Progress:
    """Seeds done of the total, failures so far, elapsed time and ETA, on stderr and nowhere
    else (stdout is the report's): a tqdm bar when stderr is a terminal, else a plain line at
    the start, at most every `PLAIN_EVERY_S` and at the end. The clock is tqdm's: this module
    reads none itself (the twin's import contract)."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        from tqdm import tqdm  # type: ignore[import-untyped]

        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.failed: list[int] = []
        self.bar: Any = tqdm(
            total=total,
            unit="seed",
            smoothing=0,  # the average since the start: a steadier ETA than the last batches'
            postfix=self._failures(),
            bar_format=TTY_FORMAT if self.tty else LINE_FORMAT,
            file=self.stream if self.tty else _Discard(),
            dynamic_ncols=self.tty,
            leave=False,
        )
        self._shown_at: float | None = None
        self._shown_n = -1
        if not self.tty:
            self._line()

    def _failures(self) -> str:
        if not self.failed:
            return "0 failed"
        seeds = ", ".join(map(str, sorted(self.failed)[:SHOWN_FAILURES]))
        more = ", ..." if len(self.failed) > SHOWN_FAILURES else ""
        return f"{len(self.failed)} failed ({seeds}{more})"

    def _line(self) -> None:
        self._shown_at = float(self.bar.format_dict["elapsed"])
        self._shown_n = self.bar.n
        print(str(self.bar), file=self.stream, flush=True)

    def advance(self, batch: list[SeedResult]) -> None:
        failed = [r.seed for r in batch if not r.verdict.passed]
        if failed:
            self.failed += failed
            self.bar.set_postfix_str(self._failures(), refresh=False)
        self.bar.update(len(batch))
        if self.tty:
            return
        since = float(self.bar.format_dict["elapsed"]) - (self._shown_at or 0.0)
        if self.bar.n >= self.bar.total or since >= PLAIN_EVERY_S:
            self._line()

    def close(self) -> None:
        if not self.tty and self._shown_n != self.bar.n:  # stopped early: say how far it got
            self._line()
        self.bar.close()


def report_failure(r: SeedResult, out: Path) -> list[str]:
    v = r.verdict
    lines = [f"FAIL seed {r.seed} [{v.kind}] {v.messages[0] if v.messages else ''}"]
    lines += [f"     also [{k}] {m}" for k, m in zip(v.kinds[1:], v.messages[1:], strict=True)]
    lines.append(
        f"  replay: llmgw-twin fuzz --seeds {r.seed}..{r.seed}  (trace sha256 {v.trace_sha256})"
    )
    s = r.shrunk
    if s is None:
        return lines
    out.mkdir(parents=True, exist_ok=True)
    full = out / f"seed-{r.seed}-full.yaml"
    minimal = out / f"seed-{r.seed}.yaml"
    full.write_text(s.full_text)
    minimal.write_text(s.text)
    (f0, n0, d0, t0), (f1, n1, d1, t1) = s.before, s.after
    lines += [
        f"  shrunk in {s.runs} runs: faults {f0} -> {f1}, nodes {n0} -> {n1}, deployments "
        f"{d0} -> {d1}, duration {fmt_duration(t0)} -> {fmt_duration(t1)}",
        f"  minimal: llmgw-twin run {minimal}  (trace sha256 {s.trace_sha256[:16]}...)",
        f"  the seed's own scenario: {full}",
    ]
    return lines


def sweep(
    seeds: range, jobs: int | None = 1, ray_address: str | None = None, quiet: bool = True
) -> list[SeedResult]:
    """Every seed's result, in seed order, whichever way they ran."""
    results: list[SeedResult] = []
    progress = None if quiet else Progress(len(seeds))
    try:
        source = run_ray(seeds, ray_address) if ray_address else run_local(seeds, jobs)
        for batch in source:
            results.extend(batch)
            if progress is not None:
                progress.advance(batch)
    finally:
        if progress is not None:
            progress.close()
    return sorted(results, key=lambda r: r.seed)


def main(args: argparse.Namespace) -> int:
    try:
        seeds = parse_seeds(args.seeds)
        if args.jobs is not None and args.jobs < 1:
            raise ValueError("--jobs must be at least 1")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_INVALID
    try:
        results = sweep(seeds, args.jobs, args.ray, args.quiet)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_INVALID
    coverage = Coverage()
    out = Path(args.out)
    for r in results:
        coverage.add(r)
        if not r.verdict.passed:
            print("\n".join(report_failure(r, out)), flush=True)
    if len(results) == 1 and results[0].verdict.passed:
        print(f"PASS seed {results[0].seed}  (trace sha256 {results[0].verdict.trace_sha256})")
    print(coverage.summary(full=not args.quiet))
    return EXIT_FAILED if coverage.failed else EXIT_OK
