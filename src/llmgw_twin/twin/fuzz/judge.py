"""The fuzzer's judge: run one seed's scenario, say whether and how it failed, count coverage.

Role: `check_seed(seed)` generates the seed's plan (`gen.py`), writes it as a scenario file
text, loads that text with the scenario loader and runs it in the twin. A seed fails when the
run raises (`crash:<exception>`), when an invariant the twin checks after every step is
violated (`invariant:<name>`, safety), or when the liveness expectation at the end fails
(`liveness`). A failing seed is shrunk (`shrink.py`) to a minimal plan that fails the same
way. `check_batch` does a list of seeds (one pool or Ray task); `Coverage` adds up what the
seeds exercised: fault kinds, event kinds and recovery paths.

Invariants: a seed's result depends on the seed alone (and the code): its trace hash is the one
`llmgw-twin run` gives for the written file; results hold only plain values, so they cross
process and Ray boundaries.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from llmgw_twin.control.model import TraceEvent
from llmgw_twin.twin.fuzz.gen import capacity_allows, generate, scenario_text
from llmgw_twin.twin.fuzz.plan import Plan
from llmgw_twin.twin.scenario.loader import load_scenario_text
from llmgw_twin.twin.scenario.model import INVARIANTS, StateExpectation
from llmgw_twin.twin.world.runner import RunResult, run_scenario

LIVENESS = "liveness"

RECOVERY_PATHS: tuple[tuple[str, str, str], ...] = (
    # name, event kind, pattern its reason (or `ready`) matches
    ("failed: node lost", "replica.failed", r"^node \S+ lost$"),
    ("failed: engine exited", "replica.failed", r"exited with code"),
    ("failed: shard vanished", "replica.failed", r"vanished from"),
    ("failed: shard went down", "replica.failed", r" went "),
    ("failed: GPU failed", "replica.failed", r"^GPU \d+ failed"),
    ("failed: start deadline", "replica.failed", r"not ready within"),
    ("failed: hung leader", "replica.failed", r"not answering for"),
    ("failed: short after restart", "replica.failed", r"short of shard"),
    ("failed: node re-registered", "replica.failed", r"registered again"),
    ("adopted ready after restart", "replica.adopted", r"^True$"),
    ("adopted loading after restart", "replica.adopted", r"^False$"),
    ("degraded", "replica.degraded", r""),
    ("degraded, then recovered", "replica.recovered", r""),
    ("unroutable (suspect node)", "replica.unroutable", r""),
    ("quarantined", "node.quarantined", r""),
    ("quarantine expired", "node.unquarantined", r""),
    ("backoff", "replica.backoff", r""),
    ("mass-loss hold", "fleet.hold", r""),
    ("mass-loss resumed", "fleet.resumed", r""),
    ("mass-loss accepted", "fleet.loss_accepted", r""),
    ("loss paced (node kept)", "node.loss_paced", r""),
    ("scaled down", "replica.reaped", r"^scaled down$"),
    ("unplaceable", "replica.unplaceable", r""),
    ("link down seen", "node.link_down", r""),
)
"""How each recovery path shows in the trace. A replacement of a failed replica is a new
replica, placed in the same step or later; liveness judges that it became ready."""
_PATTERNS = [(name, kind, re.compile(p)) for name, kind, p in RECOVERY_PATHS]


@dataclass(frozen=True, slots=True)
class Verdict:
    """One run judged: `kinds` are the failure kinds, most important first (empty: passed)."""

    kinds: tuple[str, ...]
    messages: tuple[str, ...]
    trace_sha256: str
    liveness_asserted: bool
    events: dict[str, int] = field(default_factory=dict)
    faults: dict[str, int] = field(default_factory=dict)
    paths: dict[str, int] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.kinds

    @property
    def kind(self) -> str:
        return self.kinds[0] if self.kinds else ""


@dataclass(frozen=True, slots=True)
class Shrunk:
    """A failing seed's minimal scenario, and how far it came down."""

    text: str
    full_text: str
    trace_sha256: str
    runs: int
    before: tuple[int, int, int, int]
    """faults, nodes, deployments, duration (ms) of the seed's own scenario"""
    after: tuple[int, int, int, int]


@dataclass(frozen=True, slots=True)
class SeedResult:
    seed: int
    enabled: tuple[str, ...]
    verdict: Verdict
    shrunk: Shrunk | None = None


def judge_plan(plan: Plan) -> Verdict:
    """Write, load and run the plan; a scenario the loader refuses is a generator bug and
    raises (`ScenarioError`)."""
    text = scenario_text(plan)
    scenario = load_scenario_text(text, f"fuzz-seed-{plan.seed}.yaml")
    asserted = any(isinstance(e, StateExpectation) for e in scenario.expectations)
    try:
        result = run_scenario(scenario)
    except Exception as err:  # the run itself broke: a failure of its own kind
        where = _where(err)
        return Verdict((f"crash:{type(err).__name__}",), (f"{err}{where}",), "-", asserted)
    return judge_result(result, asserted)


def judge_result(result: RunResult, asserted: bool) -> Verdict:
    kinds: list[str] = []
    messages: list[str] = []
    by_name = {i.name: i for i in result.invariants}
    for name in INVARIANTS:
        inv = by_name.get(name)
        if inv is not None and inv.enabled and inv.violations:
            kinds.append(f"invariant:{name}")
            messages.append(f"{name}: {inv.violations[0]}")
    failed = [o for o in result.expectations if not o.passed]
    if failed:
        kinds.append(LIVENESS)
        messages.append(f"liveness: {failed[0].message}")
    events, faults, paths = coverage_of(result.trace)
    return Verdict(
        tuple(kinds), tuple(messages), result.trace_sha256, asserted, events, faults, paths
    )


def _where(err: BaseException) -> str:
    tb = err.__traceback__
    last = None
    while tb is not None:
        last = tb
        tb = tb.tb_next
    if last is None:
        return ""
    code = last.tb_frame.f_code
    return f" (at {code.co_filename.rsplit('/src/', 1)[-1]}:{last.tb_lineno} in {code.co_name})"


def coverage_of(
    trace: tuple[TraceEvent, ...],
) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """Event kinds, fault actions of the fault phase (not the heal), and recovery paths."""
    events: Counter[str] = Counter()
    faults: Counter[str] = Counter()
    paths: Counter[str] = Counter()
    for ev in trace:
        events[ev.kind] += 1
        if ev.kind == "fault.injected":
            fault_id = ev.get("fault")
            if isinstance(fault_id, str) and fault_id.startswith("f"):
                faults[str(ev.get("action"))] += 1
            continue
        for name, kind, pattern in _PATTERNS:
            if ev.kind != kind:
                continue
            subject = ev.get("ready") if kind == "replica.adopted" else ev.get("reason")
            if pattern.search("" if subject is None else str(subject)):
                paths[name] += 1
    return dict(events), dict(faults), dict(paths)


def check_seed(seed: int, shrink: bool = True) -> SeedResult:
    plan = generate(seed)
    verdict = judge_plan(plan)
    shrunk = None
    if not verdict.passed and shrink:
        from llmgw_twin.twin.fuzz.shrink import shrink_plan

        shrunk = shrink_plan(plan, verdict.kind)
    return SeedResult(seed, plan.enabled, verdict, shrunk)


def check_batch(seeds: list[int], shrink: bool = True) -> list[SeedResult]:
    return [check_seed(s, shrink) for s in seeds]


def find_first(seeds: Iterable[int], kind: str | None = None) -> SeedResult | None:
    """The first seed that fails (with `kind`, if given), shrunk; None if none does. Runs in
    this process, so a bug planted with monkeypatch is in every run."""
    for seed in seeds:
        plan = generate(seed)
        verdict = judge_plan(plan)
        if verdict.passed or (kind is not None and kind not in verdict.kinds):
            continue
        from llmgw_twin.twin.fuzz.shrink import shrink_plan

        return SeedResult(seed, plan.enabled, verdict, shrink_plan(plan, kind or verdict.kind))
    return None


def sweep_sha256(results: Iterable[SeedResult]) -> str:
    """One digest of a sweep (seed, trace hash and failure kinds of each, in seed order): two
    sweeps of the same seeds agree on it wherever and however they ran."""
    digest = hashlib.sha256()
    for r in sorted(results, key=lambda r: r.seed):
        digest.update(f"{r.seed} {r.verdict.trace_sha256} {','.join(r.verdict.kinds)}\n".encode())
    return digest.hexdigest()


# --- adding up a sweep ---------------------------------------------------------------------------


@dataclass(slots=True)
class Coverage:
    """What a sweep exercised: per name, in how many seeds, and how often in all."""

    seeds: int = 0
    failed: list[SeedResult] = field(default_factory=list)
    results: list[SeedResult] = field(default_factory=list)
    liveness_asserted: int = 0
    enabled: Counter[str] = field(default_factory=Counter)
    faults: tuple[Counter[str], Counter[str]] = field(
        default_factory=lambda: (Counter(), Counter())
    )
    events: tuple[Counter[str], Counter[str]] = field(
        default_factory=lambda: (Counter(), Counter())
    )
    paths: tuple[Counter[str], Counter[str]] = field(default_factory=lambda: (Counter(), Counter()))

    def add(self, r: SeedResult) -> None:
        self.seeds += 1
        self.results.append(r)
        if not r.verdict.passed:
            self.failed.append(r)
        self.liveness_asserted += r.verdict.liveness_asserted
        self.enabled.update(r.enabled)
        for (seeds, total), counts in (
            (self.faults, r.verdict.faults),
            (self.events, r.verdict.events),
            (self.paths, r.verdict.paths),
        ):
            seeds.update(k for k, v in counts.items() if v)
            total.update(counts)

    def summary(self, full: bool = True) -> str:
        failed = sorted(r.seed for r in self.failed)
        head = (
            f"fuzz: {self.seeds} seeds, {len(failed)} failed"
            + (f" ({', '.join(map(str, failed[:20]))}{' ...' if len(failed) > 20 else ''})")
            * bool(failed)
            + f"; liveness asserted in {self.liveness_asserted}"
            + f"; sweep sha256 {sweep_sha256(self.results)[:16]}"
        )
        if not full:
            return head
        from llmgw_twin.control.model import CONTROL_EVENT_KINDS
        from llmgw_twin.twin.fuzz.gen import FAULT_KINDS

        lines = [head, "fault kinds        enabled in  injected in  injected"]
        lines += [
            f"  {k:<18} {self.enabled[k]:>8}  {self.faults[0][k]:>11}  {self.faults[1][k]:>8}"
            for k in FAULT_KINDS
        ]
        lines.append("event kinds                 seeds    events")
        lines += [
            f"  {k:<24} {self.events[0][k]:>7}  {self.events[1][k]:>8}"
            for k in ("fault.injected", *CONTROL_EVENT_KINDS)
        ]
        lines.append("recovery paths                    seeds     times")
        lines += [
            f"  {name:<30} {self.paths[0][name]:>7}  {self.paths[1][name]:>8}"
            for name, _, _ in RECOVERY_PATHS
        ]
        return "\n".join(lines)


__all__ = [
    "LIVENESS",
    "Coverage",
    "SeedResult",
    "Shrunk",
    "Verdict",
    "capacity_allows",
    "check_batch",
    "check_seed",
    "find_first",
    "judge_plan",
    "sweep_sha256",
]
