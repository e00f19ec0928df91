"""Real mode's verdict: a run's result (`RealResult`) and the judging done once the run is over.

The runner (`realmode/runner.py`) drives the processes and gathers what happened: the event log
on one time line, the state assertions judged as it went (`checks.state_span`), the traffic's
arrivals and latencies. What this module holds turns that into the run's outcome: every event,
requests and SLO expectation judged on the whole trace and the traffic, beside the state
assertions' outcomes already judged, in the file's order, and the latencies reported as the twin
reports them. `realmode/report.py` renders the result.

Invariants: the judging reads only what the run gathered (no process, no HTTP); the same trace
and traffic give the same outcomes, judged by the twin's own judges (`twin/world/expect.py`,
`twin/world/latency.py`) where real mode has no reason to differ. `RealResult` is imported from
the runner as well, which re-exports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from llmgw_twin.control.model import TraceEvent
from llmgw_twin.realmode.checks import judge_event_real
from llmgw_twin.realmode.traffic import RealTraffic
from llmgw_twin.twin.scenario.model import EventExpectation, RequestsExpectation, Scenario
from llmgw_twin.twin.scenario.workload_model import SloExpectation
from llmgw_twin.twin.world.expect import Outcome, judge_requests
from llmgw_twin.twin.world.latency import judge_slo
from llmgw_twin.twin.world.runner import InvariantResult


@dataclass
class RealResult:
    scenario: Scenario
    """The scenario as run: scaled and widened."""
    time_scale: float
    tolerance_ms: int
    trace: list[TraceEvent]
    expectations: list[Outcome]
    invariants: list[InvariantResult]
    wall_ms: int
    left_running: list[int] = field(default_factory=list)
    answered: dict[str, int] = field(default_factory=dict)
    """Probe chat completions the router answered with 200, per model."""
    requests: dict[str, dict[str, int]] | None = None
    """The traffic's counts per model (`realmode/traffic.py`); None without traffic."""
    latency: dict[str, dict[str, object]] | None = None
    """Per model, the served requests' latencies, as the twin reports them; None unless the
    scenario uses the workload additions."""
    workdir: str = ""
    """The run's temporary folder (removed when the run ends)."""
    groups: list[int] = field(default_factory=list)
    """Every process group the run started or saw its agents run, all ended."""

    @property
    def passed(self) -> bool:
        return (
            all(o.passed for o in self.expectations)
            and not any(i.enabled and i.violations for i in self.invariants)
            and not self.left_running
        )


def judge_outcomes(
    scenario: Scenario,
    judged: Mapping[int, Outcome],
    trace: list[TraceEvent],
    traffic: RealTraffic,
    tolerance_ms: int,
) -> list[Outcome]:
    """Every expectation's outcome, in the file's order: the state assertions' as the run judged
    them (`judged`, by index), the event, requests and SLO expectations' judged now on the whole
    `trace` and the traffic."""
    outcomes = dict(judged)
    for i, exp in enumerate(scenario.expectations):
        if isinstance(exp, EventExpectation):
            outcomes[i] = judge_event_real(exp, trace, tolerance_ms)
        elif isinstance(exp, RequestsExpectation):
            arrivals = traffic.arrivals(exp.model)
            outcomes[i] = judge_requests(exp, arrivals, traffic.failed_at(exp.model))
        elif isinstance(exp, SloExpectation):
            arrivals = traffic.arrivals(exp.model)
            failed = traffic.failed_at(exp.model)
            outcomes[i] = judge_slo(exp, traffic.latencies(), arrivals, failed)
    return [outcomes[i] for i in range(len(scenario.expectations))]


def latency_report(scenario: Scenario, traffic: RealTraffic) -> dict[str, dict[str, object]] | None:
    """Per model, the served requests' latencies as the twin reports them; None unless the
    scenario's traffic is timed (the workload additions)."""
    if not (scenario.traffic and traffic.timed):
        return None
    arrivals = {m: traffic.arrivals(m) for m in traffic.models}
    slos = [e for e in scenario.expectations if isinstance(e, SloExpectation)]
    return traffic.latencies().report(arrivals, scenario.duration_ms, slos)
