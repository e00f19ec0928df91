"""`llmgw-twin`: the command line.

    llmgw-twin run FILE... [--json] [--seed N] [--quiet]

Exit status: 0 every file passed; 1 an expectation or invariant failed; 2 a file is not a valid
scenario (or asks for what the twin cannot run), with file, line, column and what is wrong.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

from llmgw_twin import __version__
from llmgw_twin.twin.loader import ScenarioError, load_scenario
from llmgw_twin.twin.report import timeline, to_json, verdict
from llmgw_twin.twin.runner import UnsupportedScenario, run_scenario

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llmgw-twin", description=__doc__.split("\n\n")[0])
    p.add_argument("--version", action="version", version=f"llmgw-twin {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run scenario files in the twin (virtual time)")
    run.add_argument("files", nargs="+", metavar="FILE")
    run.add_argument("--json", action="store_true", help="one JSON report per file, one per line")
    run.add_argument("--seed", type=int, help="override the scenarios' seed")
    run.add_argument("--quiet", "-q", action="store_true", help="print only the verdict lines")
    return p


def cmd_run(args: argparse.Namespace) -> int:
    worst = EXIT_OK
    for path in args.files:
        try:
            scenario = load_scenario(path)
            started = time.perf_counter()
            result = run_scenario(scenario, seed=args.seed)
            wall_ms = round((time.perf_counter() - started) * 1000)
        except (ScenarioError, UnsupportedScenario) as e:
            print(f"error: {e}", file=sys.stderr)
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
    return worst


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "run":
        return cmd_run(args)
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
