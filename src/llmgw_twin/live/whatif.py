"""`llmgw-twin what-if`: rehearse actions on the fleet you run, in the twin, before taking them.

From a snapshot file (`--snapshot fleet.yaml`, as `llmgw-twin snapshot` writes it) or a live
controller (`--controller URL`, read as `snapshot` reads it), one or more actions (a drain, a
cordon, a node or fabric lost or down for a while, a scale, a profile change, a failed GPU; see
`whatif_actions.py`), all at `--at`: the twin runs the fleet from that state with the actions
for `--watch` after them, once per seed, and prints what it predicts (`whatif_outcome.py`):
replicas failed, moved and placed, engines started, when every model is whole again, capacity
per model over time, requests failed at the traffic's rate, and what stays unplaceable and why.

`-o FILE` writes the scenario that ran (the snapshot with the actions as faults), to put in CI;
`--html FILE` the first seed's page with its capacity chart; `--json` the outcome as data.
Bad input is one line on stderr and exit 2, before anything runs: a snapshot that does not
load, an action naming what the fleet does not have, a controller that cannot be reached.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from llmgw_twin.live.whatif_actions import (
    Action,
    ActionError,
    add_action_arguments,
    check,
    faults,
)
from llmgw_twin.live.whatif_outcome import Outcome, as_json, render
from llmgw_twin.twin.scenario.loader import ScenarioError, load_scenario, load_scenario_text
from llmgw_twin.twin.scenario.model import Scenario
from llmgw_twin.units import fmt_duration, parse_duration

MAX_SEEDS = 100


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--snapshot", type=Path, metavar="FILE", help="a snapshot scenario file")
    source.add_argument(
        "--controller",
        metavar="URL",
        help="a live controller to snapshot first (every controller's URL, comma-separated)",
    )
    parser.add_argument("--token-file", type=Path, help="the admin token (else $LLMGW_TWIN_TOKEN)")
    parser.add_argument("--ca", type=Path, help="CA bundle for the controller's TLS")
    parser.add_argument("--cert", type=Path, help="client certificate (mutual TLS)")
    parser.add_argument("--key", type=Path, help="client key (mutual TLS)")
    add_action_arguments(parser)
    parser.add_argument(
        "--at", default="30s", help="when the actions happen, from the snapshot (default 30s)"
    )
    parser.add_argument(
        "--watch", default="30m", help="how long the twin runs after them (default 30m)"
    )
    parser.add_argument(
        "--seeds", type=int, default=3, help=f"how many seeds to run (default 3, most {MAX_SEEDS})"
    )
    parser.add_argument(
        "--rate",
        action="append",
        default=[],
        metavar="MODEL=R/s",
        help="requests a model receives (default: the snapshot's traffic); R/s, R/min or R/h",
    )
    parser.add_argument("-o", "--out", type=Path, help="write the scenario that ran to FILE")
    parser.add_argument("--html", type=Path, help="write the first seed's HTML page to FILE")
    parser.add_argument("--json", action="store_true", help="print the outcome as JSON")


class WhatIfError(Exception):
    """One line saying why nothing was run."""


def main(args: argparse.Namespace) -> int:
    try:
        plan = prepare(args)
    except (WhatIfError, ActionError, ScenarioError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    scenario, at_ms, text = plan
    if args.out is not None:
        from llmgw_twin.service.ops.snapshot import SnapshotError, write_atomically

        try:
            write_atomically(args.out, text)
        except SnapshotError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    from llmgw_twin.twin.world.runner import run_scenario

    outcomes: list[Outcome] = []
    first = None
    for i in range(args.seeds):
        seed = scenario.seed + i
        began = time.monotonic()
        result = run_scenario(scenario, seed)
        first = first or result
        outcomes.append(Outcome.of(result, at_ms))
        if not args.json:
            took = time.monotonic() - began
            print(
                f"seed {seed}: ran {fmt_duration(scenario.duration_ms)} in {took:.1f}s",
                file=sys.stderr,
                flush=True,
            )
    if args.html is not None and first is not None:
        from llmgw_twin.twin.report.html import render_html

        try:
            args.html.write_text(render_html(first), encoding="utf-8")
        except OSError as e:
            print(f"error: --html: cannot write {args.html}: {e.strerror or e}", file=sys.stderr)
            return 2
    end_ms = scenario.duration_ms
    if args.json:
        print(
            json.dumps(
                {
                    "actions": [str(a) for a in args.actions],
                    "at_ms": at_ms,
                    "end_ms": end_ms,
                    "seeds": [as_json(o) for o in outcomes],
                },
                indent=2,
            )
        )
    else:
        print(render(outcomes, at_ms, end_ms, _headline(args.actions, scenario, at_ms, args)))
    return 0


def prepare(args: argparse.Namespace) -> tuple[Scenario, int, str]:
    """The scenario to run (the fleet with the actions as faults), the actions' instant and the
    scenario's text; every refusal before anything runs."""
    actions: list[Action] = list(args.actions)
    if not actions:
        raise WhatIfError("no action given: name one or more (--drain NODE, --fabric-down ...)")
    if not 1 <= args.seeds <= MAX_SEEDS:
        raise WhatIfError(f"--seeds {args.seeds}: from 1 to {MAX_SEEDS}")
    at_ms, watch_ms = parse_duration(str(args.at)), parse_duration(str(args.watch))
    if watch_ms <= 0:
        raise WhatIfError("--watch must be more than 0")
    data, source, base = _fleet(args)
    check(actions, base)
    end_ms = at_ms + watch_ms
    data = dict(data)
    data["duration"] = fmt_duration(end_ms)
    data["faults"] = faults(actions, at_ms, end_ms)
    data.pop("expect", None)
    data["description"] = f"what-if of {source}: " + ", ".join(str(a) for a in actions)
    traffic = _traffic(data.get("traffic"), args.rate, {str(d.model) for d in base.deployments})
    if traffic:
        data["traffic"] = traffic
    else:
        data.pop("traffic", None)
    text = f"# llmgw-twin what-if of {source} (docs/live-twin.md)\n" + yaml.safe_dump(
        data, sort_keys=False, default_flow_style=None, width=100
    )
    return load_scenario_text(text, f"what-if of {source}"), at_ms, text


def _fleet(args: argparse.Namespace) -> tuple[dict[str, Any], str, Scenario]:
    """The fleet as scenario data, where it came from, and as the loader checked it."""
    if args.snapshot is not None:
        base = load_scenario(args.snapshot)  # refused with its own file, line and column
        data = yaml.safe_load(args.snapshot.read_text(encoding="utf-8"))
        return data, str(args.snapshot), base
    from llmgw_twin.service.ops.snapshot import SnapshotError, fetch_state, scenario

    try:
        state = fetch_state(args)
    except SnapshotError as e:
        raise WhatIfError(str(e)) from None
    try:
        data = scenario(state, "what-if", 600_000, 0)
    except (KeyError, TypeError, AttributeError) as e:
        raise WhatIfError(f"the controller's state is not as expected ({e!r})") from None
    source = str(args.controller)
    return data, source, load_scenario_text(yaml.safe_dump(data, sort_keys=False), source)


def _traffic(given: Any, rates: list[str], models: set[str]) -> list[dict[str, Any]]:
    items = given if isinstance(given, list) else ([given] if isinstance(given, dict) else [])
    by_model: dict[str, dict[str, Any]] = {str(t.get("model")): dict(t) for t in items}
    for text in rates:
        model, found, rate = text.partition("=")
        if not found or not model or not rate:
            raise WhatIfError(f"--rate {text!r}: expected MODEL=R/s (chat=5/s)")
        if model not in models:
            raise WhatIfError(f"--rate {text}: the fleet deploys no model '{model}'")
        if rate.strip() in ("0", "0/s", "0/min", "0/h"):
            by_model.pop(model, None)
            continue
        by_model[model] = {**by_model.get(model, {"tokens": 32}), "model": model, "rate": rate}
    return [by_model[m] for m in sorted(by_model)]


def _headline(actions: list[Action], sc: Scenario, at_ms: int, args: argparse.Namespace) -> str:
    source = args.snapshot if args.snapshot is not None else args.controller
    replicas = len(sc.initial.replicas) if sc.initial is not None else 0
    return (
        f"what-if on {source} ({len(sc.nodes)} nodes, {len(sc.deployments)} models, "
        f"{replicas} replicas): {', '.join(str(a) for a in actions)} at +{fmt_duration(at_ms)}, "
        f"watched for {fmt_duration(sc.duration_ms - at_ms)}, {args.seeds} seed(s) from "
        f"{sc.seed}"
    )
