"""State assertions and invariants judged from outside real processes.

A state assertion (`at: T`) is read on the controller's admin state at T; real processes get
where the twin got at once a little later, so a reading that does not hold is followed by
another every poll, until one holds or the span ends (`state_span`): T plus the tolerance, but
never within `STATE_MARGIN_MS` of the next fault after T, whose effects the assertion does not
speak of. The assertion passes if any reading in the span held, and says how long after T
(`judge_state_readings`): the run's measured lag for that assertion.

The twin checks its invariants against ground truth it holds; a real run only has what the
controller's admin state, its event log, the agents' own state and the router's answers show,
read every poll. So in real mode:

- `single_fabric`: every live replica's nodes lie in one fabric of the scenario, and it is the
  replica's;
- `gpu_exclusive`: no (node, GPU) is claimed by two live replicas' shards;
- `ready_is_whole`: a replica the controller calls ready has every shard reported up (the leader
  serving with an endpoint) on a node it does not hold lost;
- `routes_to_ready`: a probe request per model per poll goes through the router; the replica that
  answered must not have been failed or reaped before the request was sent;
- `no_orphans`: at the end, every process an agent still runs belongs to a live replica placed
  on that node.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from llmgw_twin.control.model import TraceEvent
from llmgw_twin.twin.scenario.model import INVARIANTS, EventExpectation, Scenario, StateExpectation
from llmgw_twin.twin.world.expect import Outcome, judge_event, matches
from llmgw_twin.twin.world.runner import InvariantResult
from llmgw_twin.units import fmt_ms, fmt_offset

ROUTE_SLACK_MS = 50
"""Clock mapping between processes is good to a few ms; a pick this close to a failure is a race,
not a violation."""


STATE_MARGIN_MS = 100
"""A state assertion is never read later than this before the next fault's instant: a reading
must show the state the fault has not yet touched."""


def state_span(exp: StateExpectation, fault_times: Sequence[int], tolerance_ms: int) -> int:
    """The last instant at which `exp` may still be read: its instant plus the tolerance, but
    never within `STATE_MARGIN_MS` of the next fault after its instant (and never before the
    instant itself: then it gets the one reading at its instant)."""
    end = exp.at_ms + tolerance_ms
    later = [t for t in fault_times if t > exp.at_ms]
    if later:
        end = min(end, min(later) - STATE_MARGIN_MS)
    return max(exp.at_ms, end)


@dataclass(frozen=True, slots=True)
class Reading:
    """One reading of the controller's state for one assertion: when its answer came, and what
    was wrong (None: the controller did not answer; empty: the assertion held) or seen."""

    t_ms: int
    problems: tuple[str, ...] | None
    seen: tuple[str, ...] = ()

    @property
    def held(self) -> bool:
        return self.problems is not None and not self.problems


def read_state(
    exp: StateExpectation,
    t_ms: int,
    state: dict[str, Any] | None,
    leaders: Sequence[str] | None = None,
) -> Reading:
    """What the controller's admin state (None: no answer) says of each of `exp`'s assertions;
    `leaders`: the controllers that lead now, as the run read them (None: one controller, c1)."""
    problems: list[str] = []
    seen: list[str] = []
    leading = list(leaders) if leaders is not None else (["c1"] if state is not None else [])
    if exp.leader is not None or exp.leaders is not None:
        seen.append(f"leading {leading}")
    if exp.leader is not None and exp.leader not in leading:
        problems.append(f"{exp.leader} does not lead (leading: {leading or 'none'})")
    if exp.leaders is not None and len(leading) != exp.leaders:
        problems.append(f"{len(leading)} controller(s) lead, want {exp.leaders}")
    about_state = (exp.ready_replicas, exp.idle_nodes, exp.node_state, exp.replicas_in)
    if state is None:
        if any(x is not None for x in about_state):
            return Reading(t_ms, None)
        return Reading(t_ms, tuple(problems), tuple(seen))
    replicas = state["replicas"]
    for model, want in exp.ready_replicas or ():
        # as the twin counts them: ready and routable (not on a silent node)
        got = sum(
            1
            for r in replicas
            if r["model"] == model and r["state"] == "ready" and r.get("routable", True)
        )
        seen.append(f"{model} ready {got}")
        if got != want:
            problems.append(f"{model}: {got} ready replicas, want {want}")
    if exp.idle_nodes is not None:
        idle = sorted(
            n["node"]
            for n in state["nodes"]
            if n["state"] == "alive" and all(g["replica"] is None for g in n["gpus"])
        )
        seen.append(f"idle {idle}")
        if idle != sorted(exp.idle_nodes):
            problems.append(f"idle nodes are {idle}, want {sorted(exp.idle_nodes)}")
    states = {n["node"]: n["state"] for n in state["nodes"]}
    for node, want_state in exp.node_state or ():
        got_state = states.get(node) or "unknown"
        seen.append(f"{node} {got_state}")
        if got_state != want_state:
            problems.append(f"{node} is {got_state}, want {want_state}")
    for fabric, want in exp.replicas_in or ():
        got = sum(1 for r in replicas if r["fabric"] == fabric)
        seen.append(f"{fabric} {got}")
        if got != want:
            problems.append(f"{fabric} holds {got} replicas, want {want}")
    return Reading(t_ms, tuple(problems), tuple(seen))


def judge_state_readings(
    exp: StateExpectation, readings: Sequence[Reading], end_ms: int
) -> Outcome:
    """Passed when a reading in [instant, `end_ms`] held (the first reading, taken at the
    instant, counts even if its answer came later). The message says when the one that held
    came, as a lag after the instant, or what the last reading in the span showed."""
    at = f"at {fmt_ms(exp.at_ms)}: "
    counted = [r for i, r in enumerate(readings) if i == 0 or r.t_ms <= end_ms]
    for r in counted:
        if r.held:
            lag = f" (read {fmt_offset(r.t_ms - exp.at_ms)} after)" if len(counted) > 1 else ""
            return Outcome(exp.text, exp.line, True, at + ", ".join(r.seen) + lag)
    answered = [r for r in counted if r.problems is not None]
    if not answered:
        return Outcome(exp.text, exp.line, False, at + "the controller did not answer")
    last = answered[-1]
    assert last.problems is not None
    span = (
        f" (read {len(counted)} times to {fmt_ms(end_ms)}, none held)" if len(counted) > 1 else ""
    )
    return Outcome(exp.text, exp.line, False, at + "; ".join(last.problems) + span)


class RealInvariants:
    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self._fabric_of = {n.node: n.fabric for n in scenario.all_nodes}
        self.violations: dict[str, list[str]] = {name: [] for name in INVARIANTS}
        self.checks: dict[str, int] = dict.fromkeys(INVARIANTS, 0)
        self._picks: list[tuple[int, str]] = []
        self.answered: dict[str, int] = {}
        """Probe requests each model's router answered with 200."""
        self.controller_url = ""

    def _fail(self, name: str, t_ms: int, message: str) -> None:
        if len(self.violations[name]) < 50 and not any(message in v for v in self.violations[name]):
            self.violations[name].append(f"t={t_ms}ms {message}")

    async def observe(self, t_ms: int, state: dict[str, Any], client: httpx.AsyncClient) -> None:
        self.check_state(t_ms, state)
        models = sorted({r["model"] for r in state["replicas"] if r["state"] == "ready"})
        for model in models:  # one probe per model per poll: bounded by the run's length
            sent = t_ms
            try:
                r = await client.post(
                    f"{self.controller_url}/v1/chat/completions",
                    json={
                        "model": model,
                        "messages": [{"role": "user", "content": "ping"}],
                        "max_tokens": 2,
                    },
                )
            except httpx.HTTPError:
                continue
            replica = r.headers.get("x-llmgw-replica")
            if r.status_code == 200 and replica:
                self._picks.append((sent, replica))
                self.answered[model] = self.answered.get(model, 0) + 1

    def check_state(self, t_ms: int, state: dict[str, Any]) -> None:
        lost = {n["node"] for n in state["nodes"] if n["state"] == "lost"}
        claimed: dict[tuple[str, int], str] = {}
        for rep in state["replicas"]:
            rid = rep["replica"]
            self.checks["single_fabric"] += 1
            fabrics = sorted({self._fabric_of.get(n, "?") for n in rep["nodes"]})
            if fabrics and fabrics != [rep["fabric"]]:
                self._fail("single_fabric", t_ms, f"{rid} has shards in {', '.join(fabrics)}")
            self.checks["gpu_exclusive"] += 1
            for shard in rep["shards"]:
                for g in shard["gpus"]:
                    other = claimed.setdefault((shard["node"], g), rid)
                    if other != rid:
                        self._fail(
                            "gpu_exclusive",
                            t_ms,
                            f"GPU {g} of {shard['node']} held by {other} and {rid}",
                        )
            if rep["state"] == "ready":
                self.checks["ready_is_whole"] += 1
                for shard in rep["shards"]:
                    want = "serving" if shard["rank"] == 0 else "running"
                    if shard["node"] in lost:
                        problem = f"rank {shard['rank']} is on lost node {shard['node']}"
                    elif shard["state"] != want:
                        problem = f"rank {shard['rank']} is {shard['state']}, not {want}"
                    elif shard["rank"] == 0 and not shard["endpoint"]:
                        problem = "the leader has no endpoint"
                    else:
                        continue
                    self._fail("ready_is_whole", t_ms, f"{rid} ready but {problem}")

    def at_end(
        self,
        t_ms: int,
        state: dict[str, Any] | None,
        agents: dict[Any, dict[str, Any] | None],
    ) -> None:
        if state is None:
            self._fail("no_orphans", t_ms, "the controller did not answer at the end")
            return
        self.check_state(t_ms, state)
        placed = {
            (shard["node"], rep["replica"], shard["rank"])
            for rep in state["replicas"]
            for shard in rep["shards"]
        }
        for node, agent in sorted(agents.items()):
            self.checks["no_orphans"] += 1
            for proc in (agent or {}).get("processes", []):
                if (node, proc["replica"], proc["rank"]) not in placed:
                    self._fail(
                        "no_orphans",
                        t_ms,
                        f"{node} still runs {proc['replica']}/{proc['rank']} ({proc['role']}), "
                        "which no live replica places there",
                    )

    def judge_routes(self, trace: list[TraceEvent]) -> None:
        gone: dict[str, int] = {}
        for ev in trace:
            rid = ev.get("replica")
            if ev.kind in ("replica.failed", "replica.reaped") and isinstance(rid, str):
                gone.setdefault(rid, ev.t_ms)
        for sent, rid in self._picks:
            self.checks["routes_to_ready"] += 1
            if rid in gone and gone[rid] + ROUTE_SLACK_MS < sent:
                self._fail(
                    "routes_to_ready",
                    sent,
                    f"router answered with {rid}, out of service since t={gone[rid]}ms",
                )

    def results(self) -> list[InvariantResult]:
        off = dict(self.scenario.invariants_off)
        return [
            InvariantResult(
                name,
                name not in off,
                off.get(name),
                self.checks[name],
                tuple(self.violations[name]),
            )
            for name in INVARIANTS
        ]


def judge_event_real(exp: EventExpectation, trace: list[TraceEvent], tolerance_ms: int) -> Outcome:
    """An event expectation on a real trace, `exp` widened by the tolerance (`widen`). A `count`
    holds when it lies between what surely falls inside the file's window (the window narrowed
    by the tolerance) and what may (widened): widening alone would count an event just before
    the window, narrowing alone would miss one just inside it."""
    wide = judge_event(exp, trace)
    if exp.count is None or wide.passed:
        return wide
    start, end = exp.start_ms + 2 * tolerance_ms, exp.end_ms - 2 * tolerance_ms
    inside = [ev for ev in trace if matches(ev, exp)]
    may = sum(1 for ev in inside if exp.start_ms <= ev.t_ms <= exp.end_ms)
    surely = sum(1 for ev in inside if start <= ev.t_ms <= end) if start <= end else 0
    if surely <= exp.count <= may:
        window = f"[{fmt_ms(exp.start_ms)}, {fmt_ms(exp.end_ms)}]"
        message = f"{may} in {window}, {surely} surely inside the file's window (want {exp.count})"
        return Outcome(exp.text, exp.line, True, message)
    return wide
