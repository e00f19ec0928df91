"""`llmgw-twin replay`: a controller's event log and a time window made into a scenario that
reproduces the incident (docs/live-twin.md, "Replay").

Role: reads the log (`replay_log.py`: a file, or a live controller's `/v1/admin/events`) and the
fleet (a live controller's admin state as `snapshot` reads it, or `--fleet FILE`, a scenario);
folds the log up to the window's start into an `initial` section (`replay_fold.py`); infers the
window's faults (`replay_infer.py`); pins the controller's decisions in the window as
expectations (`replay_check.py`); writes the file whole or not at all. `--check` runs the twin on
it and lists each logged decision it did not make; `--shrink` drops every fault the file's
expectations pass without. Every failure is one line on stderr and exit 2, with nothing written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from llmgw_twin.control.model import TraceEvent
from llmgw_twin.live.replay_check import Decision, compare, decisions, expectations
from llmgw_twin.live.replay_fold import Fold
from llmgw_twin.live.replay_infer import infer_faults
from llmgw_twin.live.replay_log import EventLog, ReplayError, fetch_log, parse_time, read_log
from llmgw_twin.live.replay_log import save_log as log_text
from llmgw_twin.live.replay_nodes import REPORT_MS, Inferred, added_nodes
from llmgw_twin.service.ops.ctl import _common
from llmgw_twin.service.ops.snapshot import SnapshotError, fetch_state, scenario, write_atomically
from llmgw_twin.twin.scenario.loader import ScenarioError, load_scenario_text
from llmgw_twin.twin.scenario.model import EventExpectation, Scenario
from llmgw_twin.twin.world.runner import run_scenario
from llmgw_twin.units import fmt_duration, parse_duration

FLEET_KEYS = ("timings", "cluster", "profiles", "deployments")
_DURATIONS = ("for", "down_for")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "log",
        nargs="?",
        type=Path,
        help="the event log: JSON lines or a `run --json` report (without it: the live "
        "controller's, from --controller)",
    )
    _common(parser)
    parser.add_argument("-o", "--out", type=Path, required=True, help="the scenario file to write")
    parser.add_argument(
        "--fleet", type=Path, help="a scenario file (e.g. a snapshot) with the fleet of a log file"
    )
    parser.add_argument(
        "--from",
        dest="start",
        help="the window's start: a t_ms of the log, an ISO 8601 time, or a duration after the "
        "log's first event (default: the log's first event)",
    )
    parser.add_argument("--to", dest="end", help="the window's end, as --from (default: the last)")
    parser.add_argument(
        "--tolerance",
        help="how far from its logged time a decision may fall (default: a heartbeat interval "
        "and two reconcile intervals, at least 2s)",
    )
    parser.add_argument("--name", default="replay", help="the scenario's name (default replay)")
    parser.add_argument("--seed", type=int, help="the scenario's seed (default: the fleet's, or 0)")
    parser.add_argument("--save-log", type=Path, help="also write the log read, as JSON lines")
    parser.add_argument(
        "--check", action="store_true", help="run the twin on the file and compare its decisions"
    )
    parser.add_argument(
        "--shrink",
        action="store_true",
        help="drop every inferred fault the file's expectations still pass without",
    )


def main(args: argparse.Namespace) -> int:
    try:
        log, fleet = _inputs(args)
        text, replay = build(log, fleet, args)
        if args.save_log is not None:
            write_atomically(args.save_log, log_text(log))
        if args.shrink:
            text, dropped = shrink(text, str(args.out))
        write_atomically(args.out, text)
    except (ReplayError, SnapshotError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        print(f"error: the log or the fleet is not as expected ({e!r})", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: {replay.summary()}")
    for line in replay.notes():
        print(f"  {line}")
    for line in replay.cautions:
        print(f"  caution: {line}")
    if args.shrink:
        print(f"  shrunk: {dropped} fault(s) dropped that no expectation needs")
    if not args.check:
        return 0
    return check(text, str(args.out), replay)


def _inputs(args: argparse.Namespace) -> tuple[EventLog, dict[str, Any]]:
    if args.log is None:
        log = fetch_log(args)
        if args.fleet is None:
            return log, scenario(fetch_state(args), "fleet", 60_000, 0)
    elif args.fleet is None:
        raise ReplayError(
            "a log file needs --fleet FILE (a scenario, e.g. from llmgw-twin snapshot) for "
            "its nodes, profiles and deployments"
        )
    else:
        log = read_log(args.log)
    try:
        raw = yaml.safe_load(args.fleet.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ReplayError(f"cannot read the fleet {args.fleet}: {e}") from None
    if not isinstance(raw, dict) or "cluster" not in raw:
        raise ReplayError(f"{args.fleet}: not a scenario (no cluster)")
    return log, raw


class Replay:
    """What `build` made, for the summary and `--check`."""

    def __init__(self, window: tuple[int, int], n_events: int, at_start: int) -> None:
        self.window = window
        self.n_events = n_events
        self.at_start = at_start
        self.faults: list[Inferred] = []
        self.logged: list[Decision] = []
        self.tolerance_ms = 0
        self.cautions: list[str] = []
        """What the window opens in the middle of, which the twin starts afresh."""

    def summary(self) -> str:
        start, end = self.window
        return (
            f"window of {fmt_duration(end - start)} ({self.n_events} event(s)), "
            f"{self.at_start} replica(s) at its start, {len(self.faults)} fault(s) inferred, "
            f"{len(self.logged)} decision(s) pinned within +-{fmt_duration(self.tolerance_ms)}"
        )

    def notes(self) -> list[str]:
        start = self.window[0]
        return [
            f"+{fmt_duration(max(0, f.at_ms - start))} {f.action}: {f.note}"
            + (" (it began before the window: from its start)" if f.at_ms < start else "")
            for f in self.faults
        ]


def build(log: EventLog, fleet_raw: dict[str, Any], args: argparse.Namespace) -> tuple[str, Replay]:
    events = [ev for ev in log.events if ev.kind != "fault.injected"]
    fleet = _fleet(fleet_raw, args)
    grouped = sorted(d.model for d in fleet.deployments if d.roles)
    if grouped:  # its members' roles and profiles are not folded from the log yet
        raise ReplayError(
            f"the fleet deploys {', '.join(grouped)} in role groups, which replay does not "
            "reproduce yet (snapshot and what-if do)"
        )
    start, end = _window(args, events)
    before = [ev for ev in events if ev.t_ms < start]
    window = [ev for ev in events if start <= ev.t_ms <= end]
    fold = Fold(fleet)
    for ev in before:
        fold.apply(ev)
    fold.honour_gpu_failures(window)
    initial = fold.initial(start)
    silent = sorted(n for n, s in fold.state.items() if s == "suspect")
    loading = sorted(r.id for r in fold.replicas.values() if r.state == "starting")
    start_ids = {r.id for r in fold.replicas.values() if r.state != "pending"}
    lost = {n for n, s in fold.state.items() if s == "lost"}
    deployments = [
        {"model": d.model, "profile": fold.profile_of[d.model], "replicas": fold.wanted[d.model]}
        for d in fleet.deployments
        if d.model not in fold.deleted
    ]
    for ev in window:  # the names checked, the wanted counts followed
        fold.apply(ev)
    t = fleet.timings
    tolerance = max(2_000, t.heartbeat_interval_ms + 2 * t.reconcile_interval_ms)
    if args.tolerance:
        try:
            tolerance = parse_duration(args.tolerance)
        except ValueError as e:
            raise ReplayError(f"--tolerance: {e}") from None
    fabrics = {str(f): tuple(str(n) for n in ns) for f, ns in fleet.fabrics}
    faults = infer_faults(window, before, start, end, t, fabrics, lost, fold.scales)
    cluster = _cluster(fleet_raw)
    for node, joined in added_nodes(events, t).items():
        fabric = next(str(n.fabric) for n in fleet.nodes if n.node == node)
        if joined >= start and len(cluster["fabrics"][fabric]) > 1:  # a fabric keeps one
            faults.append(_onboarded(cluster, fleet, node, joined))
    faults.sort(key=lambda f: f.at_ms)
    replay = Replay((start, end), len(window), len(start_ids))
    replay.faults, replay.tolerance_ms = faults, tolerance
    replay.logged = decisions(window, start, start_ids)
    replay.cautions = _cautions(silent, loading, any(f.at_ms < start for f in faults))
    out: dict[str, Any] = {
        "name": args.name,
        "description": f"replay of {log.source}, t_ms {start}..{end}, written by llmgw-twin "
        "replay (docs/live-twin.md)",
        "seed": args.seed if args.seed is not None else int(fleet_raw.get("seed") or 0),
        "duration": fmt_duration(end - start + tolerance),
        **{key: fleet_raw[key] for key in FLEET_KEYS if key in fleet_raw},
        "cluster": cluster,
        "deployments": deployments,
    }
    if before:
        out["initial"] = initial
    if faults:
        out["faults"] = [_fault(i, f, start) for i, f in enumerate(faults, 1)]
    if expect := expectations(replay.logged, tolerance):
        out["expect"] = expect
    return _text(out, replay, log.source, str(args.out)), replay


def _window(args: argparse.Namespace, events: list[TraceEvent]) -> tuple[int, int]:
    origin = events[0].t_ms
    start = parse_time(args.start, origin) if args.start else origin
    end = parse_time(args.end, origin) if args.end else events[-1].t_ms
    if start < origin:
        raise ReplayError(f"--from (t_ms {start}) is before the log's first event (t_ms {origin})")
    if end < start:
        raise ReplayError(f"--to (t_ms {end}) is before --from (t_ms {start})")
    return start, end


def _text(out: dict[str, Any], replay: Replay, source: str, path: str) -> str:
    """The file: a comment naming the source, the window, each fault and each caution; the
    scenario, checked by the loader."""
    start, end = replay.window
    head = [f"# llmgw-twin replay of {source}, t_ms {start}..{end} (docs/live-twin.md)"]
    head += [f"# fault {line}" for line in replay.notes()]
    head += [f"# caution: {line}" for line in replay.cautions]
    text = "\n".join(head) + "\n"
    text += yaml.safe_dump(out, sort_keys=False, default_flow_style=None, width=100)
    try:
        load_scenario_text(text, path)
    except ScenarioError as e:
        raise ReplayError(f"the replay is not a valid scenario: {e}") from None
    return text


def _cluster(raw: dict[str, Any]) -> dict[str, Any]:
    """The fleet's cluster, one controller, with the nodes its `add_node` faults bring."""
    cluster = {k: v for k, v in raw["cluster"].items() if k != "controllers"}
    fabrics = {f: list(ns) for f, ns in (cluster.get("fabrics") or {}).items()}
    nodes = dict(cluster.get("nodes") or {})
    for fault in raw.get("faults") or []:
        add = fault.get("add_node") if isinstance(fault, dict) else None
        if isinstance(add, dict) and add.get("fabric") in fabrics:
            fabrics[add["fabric"]].append(add["node"])
            own = {k: add[k] for k in ("gpus", "engines") if k in add}
            if own:
                nodes[add["node"]] = {**(nodes.get("default") or {}), **own}
    cluster["fabrics"] = fabrics
    if nodes:
        cluster["nodes"] = nodes
    return cluster


def _onboarded(cluster: dict[str, Any], fleet: Scenario, node: str, joined: int) -> Inferred:
    """`add_node` for a node the log shows onboarded in the window, out of the boot-time fleet."""
    info = next(n for n in fleet.nodes if n.node == node)
    fabric = cluster["fabrics"][info.fabric]
    fabric.remove(node)
    cluster.get("nodes", {}).pop(node, None)
    value = {"node": node, "fabric": str(info.fabric), "gpus": info.gpus}
    value["engines"] = [str(e) for e in info.engines]
    note = f"{node} joined at t_ms {joined}, onboarded then"
    return Inferred(joined - REPORT_MS, "add_node", value, note)


def _cautions(silent: list[str], loading: list[str], early: bool) -> list[str]:
    """What the window opens in the middle of, which the twin can only start afresh."""
    out = [
        f"node {n} was silent when the window opened: its silence counts from it" for n in silent
    ]
    out += [
        f"replica {r} was loading when the window opened: the twin loads it afresh" for r in loading
    ]
    if out or early:
        out.append("open the window earlier (--from) to replay from before the incident")
    return out


def _fleet(raw: dict[str, Any], args: argparse.Namespace) -> Scenario:
    base = {"name": "fleet", "duration": "1m", **{k: raw[k] for k in FLEET_KEYS if k in raw}}
    base["cluster"] = _cluster(raw)
    try:
        return load_scenario_text(yaml.safe_dump(base, sort_keys=False), str(args.fleet or "fleet"))
    except ScenarioError as e:
        raise ReplayError(f"the fleet is not a valid scenario: {e}") from None


def _fault(n: int, f: Inferred, start: int) -> dict[str, Any]:
    """The fault in the file: at its time from the window's start; one that began before it,
    at the start, for what is left of it (a restarted controller's outage is already cut)."""
    early = max(0, start - f.at_ms)
    left = "down_for" if f.action == "restart_agent" else "for"
    value = f.value
    if isinstance(value, dict):
        value = {
            k: fmt_duration(max(1000, int(v) - early) if k == left and early else int(v))
            if k in _DURATIONS
            else v
            for k, v in value.items()
        }
    at = fmt_duration(max(0, f.at_ms - start))
    return {"id": f"{f.action.replace('_', '-')}-{n}", "at": at, f.action: value}


def check(text: str, path: str, replay: Replay) -> int:
    """Run the twin on the written file; list each logged decision it did not make."""
    result = run_scenario(load_scenario_text(text, path))
    end = replay.window[1] - replay.window[0]
    missed, extra = compare(replay.logged, result.trace, replay.tolerance_ms, end)
    made = len(replay.logged) - len(missed)
    print(f"check: the twin made {made} of the {len(replay.logged)} logged decision(s)")
    for line in missed:
        print(f"  not made: {line}")
    for line in extra:
        print(f"  the twin also: {line}")
    broken = [i.name for i in result.invariants if i.enabled and i.violations]
    if broken:
        print(f"  invariants violated in the twin: {', '.join(broken)}")
    return 0 if not missed else 1


def shrink(text: str, path: str) -> tuple[str, int]:
    """Greedy: drop each fault (last first) whose removal keeps every expectation that passed."""
    data = yaml.safe_load(text)
    head = text.splitlines()[0] + "\n# shrunk: only the faults its expectations need\n"

    def passing(d: dict[str, Any]) -> set[int]:
        body = head + yaml.safe_dump(d, sort_keys=False, default_flow_style=None, width=100)
        result = run_scenario(load_scenario_text(body, path))
        exps = result.scenario.expectations
        return {i for i, o in enumerate(result.expectations) if o.passed and _is_event(exps[i])}

    faults = list(data.get("faults") or [])
    if not faults:
        return text, 0
    want = passing(data)
    dropped = 0
    for i in range(len(faults) - 1, -1, -1):
        trial = faults[:i] + faults[i + 1 :]
        candidate = (
            {**data, "faults": trial} if trial else {k: v for k, v in data.items() if k != "faults"}
        )
        if want <= passing(candidate):
            faults, data, dropped = trial, candidate, dropped + 1
    body = yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100)
    return head + body, dropped


def _is_event(exp: object) -> bool:
    return isinstance(exp, EventExpectation)
