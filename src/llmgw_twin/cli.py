"""`llmgw-twin`: the command line.

    llmgw-twin run FILE... [--json] [--seed N] [--quiet] [--html PATH]
    llmgw-twin run --real [--time-scale F] [--tolerance D] [--compare] FILE...
    llmgw-twin --help                    every command, grouped, one line each (`commands.py`)

`run` exit status: 0 every file passed; 1 an expectation or invariant failed; 2 a file is not a
valid scenario (or asks for what the twin cannot run), with file, line, column and what is wrong.
Each file is judged on its own: one that cannot be loaded, or whose run fails inside the twin, is
reported in one line (never a traceback) and the other files still run.
Commands other than `run` live in their own modules and are imported only when used, so the
twin's start-up does not pay for a web framework (`commands.py` lists them). A word that names
no command is answered with the nearest one, exit 2; `ctl` or `ctl gpu` alone lists what is
under it. Output cut short by a closed pipe (`--help | head`) ends quietly.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from llmgw_twin import commands

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2


def _run_parser() -> argparse.ArgumentParser:
    run = argparse.ArgumentParser(
        prog="llmgw-twin run", description=commands.BY_WORDS[commands.RUN].help
    )
    run.add_argument("files", nargs="+", metavar="FILE")
    run.add_argument("--json", action="store_true", help="one JSON report per file, one per line")
    run.add_argument("--seed", type=int, help="override the scenarios' seed")
    run.add_argument("--quiet", "-q", action="store_true", help="print only the verdict lines")
    run.add_argument(
        "--html",
        metavar="PATH",
        help="also write each run's HTML page (docs/reports.md): PATH is the page, or a "
        "directory that gets one page per FILE, named after it (several FILEs need a directory)",
    )
    run.add_argument(
        "--real", action="store_true", help="run on real processes on this machine (real mode)"
    )
    run.add_argument(
        "--time-scale",
        type=float,
        default=0.1,
        metavar="F",
        help="real mode: multiply every duration in the file by F (default 0.1)",
    )
    run.add_argument(
        "--tolerance",
        default="2s",
        metavar="D",
        help="real mode: widen every event window by D on each side (a never window narrows) "
        "and read a state assertion until D later, never past the next fault (default 2s)",
    )
    run.add_argument(
        "--compare",
        action="store_true",
        help="real mode: also run the twin on the scaled file and print the fidelity table",
    )
    return run


def _cannot(path: str, doing: str, err: Exception) -> str:
    """One line for an exception the loader or the twin should never raise: a bug, not bad
    input, but still this file's problem alone."""
    try:
        what = f"{type(err).__name__}: {err}"
    except Exception:  # an exception whose text cannot be made is still reported
        what = type(err).__name__
    what = what if len(what) <= 300 else what[:297] + "..."
    return f"error: {path}:1:1: internal error while {doing} this file ({what}); please report it"


def cmd_run_real(args: argparse.Namespace) -> int:
    """`run --real`; a stop signal (SIGINT, SIGTERM, SIGHUP) ends it with one line and exit
    status 128 + the signal's number, once the run has ended every process it started."""
    from llmgw_twin.realmode.stop import Interrupted, raise_interrupted, signals_to

    try:
        with signals_to(raise_interrupted):
            return _run_real_files(args)
    except (Interrupted, KeyboardInterrupt) as e:
        signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
        name = signal.Signals(signum).name
        print(
            f"interrupted by {name}: every process the run started is stopped and its "
            "temporary folder removed",
            file=sys.stderr,
        )
        return 128 + signum


def _run_real_files(args: argparse.Namespace) -> int:
    from llmgw_twin.realmode.ports import PortLeaseError
    from llmgw_twin.realmode.refusals import check_real_supported
    from llmgw_twin.realmode.report import fidelity, fidelity_table, timeline, to_json, verdict
    from llmgw_twin.realmode.runner import run_real
    from llmgw_twin.twin.scenario.loader import ScenarioError, load_scenario
    from llmgw_twin.twin.scenario.timescale import scale_scenario
    from llmgw_twin.twin.world.runner import run_scenario
    from llmgw_twin.units import parse_duration

    try:
        tolerance_ms = parse_duration(args.tolerance)
    except ValueError as e:
        print(f"error: --tolerance: {e}", file=sys.stderr)
        return EXIT_INVALID
    if args.time_scale <= 0:
        print("error: --time-scale must be positive", file=sys.stderr)
        return EXIT_INVALID
    worst = EXIT_OK
    for path in args.files:
        try:
            scenario = load_scenario(path)
            check_real_supported(scenario)
            if scenario.initial is not None:
                raise ValueError(
                    f"{path}: real mode does not start from an `initial` state (a snapshot's, "
                    "docs/live-twin.md): run the file in the twin"
                )
        except (ScenarioError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            worst = max(worst, EXIT_INVALID)
            continue
        except Exception as e:  # one file's failure must not stop the others
            print(_cannot(path, "loading", e), file=sys.stderr)
            worst = max(worst, EXIT_INVALID)
            continue

        def progress(line: str, name: str = scenario.name) -> None:
            print(f"[{name}] {line}", file=sys.stderr, flush=True)

        try:
            result = run_real(
                scenario, args.time_scale, tolerance_ms, progress=None if args.quiet else progress
            )
        except PortLeaseError as e:  # other runs hold every port range: this file cannot run
            print(f"error: {scenario.path}: {e}", file=sys.stderr)
            worst = max(worst, EXIT_FAILED)
            continue
        report: dict[str, object] = to_json(result)
        # the progress lines (not --quiet) gave each event as it happened: not again here
        text = timeline(result, events=False) if not args.quiet else verdict(result)
        if args.compare:  # the twin's prediction: the scaled file, judged as the twin judges it
            twin = run_scenario(scale_scenario(scenario, args.time_scale))
            fid = fidelity(twin, result)
            report["fidelity"] = fid.as_json()
            text += "\nfidelity (twin vs real, same scaled file)\n" + fidelity_table(
                fid.rows, fid.same, fid.differences
            )
        print(json.dumps(report, sort_keys=True) if args.json else text)
        if not result.passed:
            worst = max(worst, EXIT_FAILED)
    return worst


def _html_pages(html: str | None, files: Sequence[str], real: bool) -> list[Path] | str:
    """Where `run --html` writes each file's page (none without --html), or why it cannot."""
    if html is None:
        return []
    target = Path(html)
    try:
        is_dir = target.is_dir()
        parent_is_dir = is_dir or target.parent.is_dir()
    except OSError as e:
        return str(e.strerror or e)
    pages = [target / f"{Path(f).stem}.html" if is_dir else target for f in files]
    if real:
        return "a page is made of a twin run only (drop --real)"
    if not parent_is_dir:
        return f"{target.parent} is not a directory"
    if not is_dir and len(files) > 1:
        return "several FILEs need an existing directory, to hold a page for each"
    if len(set(pages)) < len(pages):
        return "two FILEs of the same name would get the same page"
    return pages


def cmd_run(args: argparse.Namespace) -> int:
    pages = _html_pages(args.html, args.files, args.real)
    if isinstance(pages, str):
        print(f"error: --html {args.html}: {pages}", file=sys.stderr)
        return EXIT_INVALID
    if args.real:
        return cmd_run_real(args)
    # imported here: an engine or an agent started through this CLI never pays for the twin,
    # and a run without --html never pays for the page
    from llmgw_twin.twin.report.text import timeline, to_json, verdict
    from llmgw_twin.twin.scenario.loader import ScenarioError, load_scenario
    from llmgw_twin.twin.world.runner import UnsupportedScenario, run_scenario

    worst = EXIT_OK
    for index, path in enumerate(args.files):
        doing = "loading"
        try:
            scenario = load_scenario(path)
            doing = "running"
            started = time.perf_counter()
            result = run_scenario(scenario, seed=args.seed)
            wall_ms = round((time.perf_counter() - started) * 1000)
        except (ScenarioError, UnsupportedScenario) as e:
            print(f"error: {e}", file=sys.stderr)
            worst = max(worst, EXIT_INVALID)
            continue
        except Exception as e:  # one file's failure must not stop the others
            print(_cannot(path, doing, e), file=sys.stderr)
            worst = max(worst, EXIT_INVALID)
            continue
        if args.json:
            print(json.dumps(to_json(result, wall_ms), sort_keys=True))
        elif args.quiet:
            print(verdict(result, wall_ms))
        else:
            print(timeline(result, wall_ms))
        if not result.passed:
            worst = max(worst, EXIT_FAILED)
        if pages:
            from llmgw_twin.twin.report.html import render_html

            page = pages[index]
            try:
                page.write_text(render_html(result), encoding="utf-8")
            except OSError as e:
                print(f"error: --html: cannot write {page}: {e.strerror or e}", file=sys.stderr)
                worst = max(worst, EXIT_INVALID)
            except Exception as e:  # a page that cannot be made is this file's problem alone
                print(_cannot(path, "making the page of", e), file=sys.stderr)
                worst = max(worst, EXIT_INVALID)
    return worst


def _lazy(command: commands.Command, rest: Sequence[str]) -> int:
    module_name, _, attr = command.target.partition(":")
    module: Any = importlib.import_module(module_name)
    if attr:
        module = getattr(module, attr)
    parser = argparse.ArgumentParser(prog=f"llmgw-twin {command.name}", description=command.help)
    add_arguments: Callable[[argparse.ArgumentParser], None] = module.add_arguments
    run: Callable[[argparse.Namespace], int] = module.main
    add_arguments(parser)
    return run(parser.parse_args(list(rest)))


def _dispatch(args: list[str]) -> int:
    found = commands.find(args)
    if found is not None and found[0].words == commands.RUN:
        return cmd_run(_run_parser().parse_args(found[1]))
    if found is not None:
        return _lazy(*found)
    if args in ([], ["-h"], ["--help"]):
        from llmgw_twin import __version__

        print(commands.top_help(__version__))
        return EXIT_OK if args else EXIT_INVALID
    if args == ["--version"]:
        from llmgw_twin import __version__  # the installed metadata's: looked up only here

        print(f"llmgw-twin {__version__}")
        return EXIT_OK
    where = commands.unknown(args)
    if isinstance(where, str):
        print(f"error: {where}", file=sys.stderr)
        return EXIT_INVALID
    rest = args[len(where) :]
    if not where:  # an option before any command: `llmgw-twin -x`
        print(
            f"error: llmgw-twin: unknown option {rest[0]!r}; "
            "`llmgw-twin --help` lists the commands",
            file=sys.stderr,
        )
        return EXIT_INVALID
    print(commands.namespace_help(where))
    if rest and rest[0] not in ("-h", "--help"):
        print(
            f"error: {rest[0]!r} is not a command of `llmgw-twin {' '.join(where)}`",
            file=sys.stderr,
        )
        return EXIT_INVALID
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        try:
            code = _dispatch(args)
        except SystemExit as e:  # argparse's --help, --version and usage errors
            if e.code is not None and not isinstance(e.code, int):
                raise
            code = e.code or 0
        sys.stdout.flush()
        return code
    except BrokenPipeError:  # `--help | head`: the reader left; say nothing more
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
