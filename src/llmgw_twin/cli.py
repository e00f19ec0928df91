"""`llmgw-twin`: the command line.

    llmgw-twin run FILE... [--json] [--seed N] [--quiet] [--html PATH]
    llmgw-twin run --real [--time-scale F] [--tolerance D] [--compare] FILE...
    llmgw-twin sim-engine ...            the runnable sim engine (see `sim-engine --help`)
    llmgw-twin ctl engine-check ...      check launch flags against an engine's own --help
    llmgw-twin controller --config FILE  the controller service (API, router, reconcile loop)
    llmgw-twin agent --config FILE       a node agent
    llmgw-twin router --config FILE      an OpenAI-compatible router fed by the controller
    llmgw-twin sidecar ...               a shard's sidecar (started by the agent)
    llmgw-twin fuzz --seeds A..B ...     generated scenarios, random faults (docs/fuzzing.md)

`run` exit status: 0 every file passed; 1 an expectation or invariant failed; 2 a file is not a
valid scenario (or asks for what the twin cannot run), with file, line, column and what is wrong.
Each file is judged on its own: one that cannot be loaded, or whose run fails inside the twin, is
reported in one line (never a traceback) and the other files still run.
Subcommands other than `run` live in their own modules and are imported only when used, so the
twin's start-up does not pay for a web framework.
"""

from __future__ import annotations

import argparse
import importlib
import json
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2

# command words -> module (or `module:Class`) with `add_arguments(parser)` and `main(args) -> int`
LAZY_COMMANDS: dict[tuple[str, ...], tuple[str, str]] = {
    ("sim-engine",): ("llmgw_twin.programs.sim_server", "run the sim engine (one shard)"),
    ("ctl", "engine-check"): (
        "llmgw_twin.programs.engine_check",
        "check every flag the project can emit against an engine's --help",
    ),
    ("ctl", "clear-gpu"): (
        "llmgw_twin.service.ops.ctl:ClearGpu",
        "clear a GPU the controller holds failed (it was repaired or replaced)",
    ),
    ("ctl", "clear-quarantine"): (
        "llmgw_twin.service.ops.ctl:ClearQuarantine",
        "lift a node's quarantine (for one profile, or all)",
    ),
    ("ctl", "new-token"): (
        "llmgw_twin.service.ops.ctl:NewToken",
        "print a fresh admin token or API key and the hash its config lists",
    ),
    ("ctl", "onboard"): (
        "llmgw_twin.service.ops.ctl:Onboard",
        "issue or rotate a node's credential and write its agent's credential file",
    ),
    ("ctl", "revoke"): (
        "llmgw_twin.service.ops.ctl:Revoke",
        "revoke a node's credential",
    ),
    ("ctl", "cordon"): (
        "llmgw_twin.service.ops.ctl_fleet:Cordon",
        "take a node out of placement (what it runs keeps running)",
    ),
    ("ctl", "uncordon"): (
        "llmgw_twin.service.ops.ctl_fleet:Uncordon",
        "put a cordoned node back into placement (ends a drain)",
    ),
    ("ctl", "drain"): (
        "llmgw_twin.service.ops.ctl_fleet:Drain",
        "move every replica off a node, make-before-break, and keep it cordoned",
    ),
    ("ctl", "explain"): (
        "llmgw_twin.service.ops.ctl_fleet:Explain",
        "why a replica is where it is, or why it is pending and where it could go",
    ),
    ("ctl", "deployment", "delete"): (
        "llmgw_twin.service.ops.ctl_fleet:DeleteDeployment",
        "delete a deployment: its replicas are retired",
    ),
    ("ctl", "gpu", "clear"): (
        "llmgw_twin.service.ops.ctl:ClearGpu",
        "clear a GPU the controller holds failed (as clear-gpu)",
    ),
    ("ctl", "status"): (
        "llmgw_twin.service.ops.ctl_status:Status",
        "show the fleet: fabrics (or every node), replicas per model, pending replicas and why",
    ),
    ("onboard",): (
        "llmgw_twin.service.ops.onboard",
        "write a node's agent config, credential, fake sysfs root and systemd units",
    ),
    ("controller",): ("llmgw_twin.service.controller.main", "run the controller service"),
    ("agent",): ("llmgw_twin.service.agent.main", "run a node agent"),
    ("router",): (
        "llmgw_twin.service.router.main",
        "run an OpenAI-compatible router that follows the controller's routing feed",
    ),
    ("sidecar",): ("llmgw_twin.service.agent.sidecar", "run a shard's sidecar"),
    ("fuzz",): (
        "llmgw_twin.twin.fuzz.cli",
        "run generated scenarios with random faults over a block of seeds (docs/fuzzing.md)",
    ),
}


def _run_parser() -> argparse.ArgumentParser:
    from llmgw_twin import __version__  # the installed metadata's: looked up only here

    p = argparse.ArgumentParser(
        prog="llmgw-twin",
        description="A control plane for LLM replicas on GPU fabrics, and its twin.",
        epilog="other commands: "
        + "; ".join(f"{' '.join(words)}: {text}" for words, (_, text) in LAZY_COMMANDS.items()),
    )
    p.add_argument("--version", action="version", version=f"llmgw-twin {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run scenario files in the twin (virtual time)")
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
    return p


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
    from llmgw_twin.realmode.faults import check_real_supported
    from llmgw_twin.realmode.ports import PortLeaseError
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
        text = timeline(result) if not args.quiet else verdict(result)
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
    # imported here: an engine or an agent started through this CLI never pays for the twin
    from llmgw_twin.twin.report.html import render_html
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


def _lazy(words: tuple[str, ...], rest: Sequence[str]) -> int:
    module_name, text = LAZY_COMMANDS[words]
    module_name, _, attr = module_name.partition(":")
    module: Any = importlib.import_module(module_name)
    if attr:
        module = getattr(module, attr)
    parser = argparse.ArgumentParser(prog="llmgw-twin " + " ".join(words), description=text)
    add_arguments: Callable[[argparse.ArgumentParser], None] = module.add_arguments
    run: Callable[[argparse.Namespace], int] = module.main
    add_arguments(parser)
    return run(parser.parse_args(list(rest)))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    for words in LAZY_COMMANDS:
        if tuple(args[: len(words)]) == words:
            return _lazy(words, args[len(words) :])
    parsed = _run_parser().parse_args(args)
    if parsed.command == "run":
        return cmd_run(parsed)
    raise AssertionError(parsed.command)


if __name__ == "__main__":
    sys.exit(main())
