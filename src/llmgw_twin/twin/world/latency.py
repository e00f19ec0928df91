"""Requests' latencies in the twin: what each served request took, per model; the report's
percentiles and goodput, and the `slo` expectations judged on them.

A served request is recorded with its arrival (the client's first attempt), its time to first
token, its end-to-end latency, the time it queued in the engine before its prefill, and its mean
time between tokens; every time in whole microseconds. A failed request has no latency: an SLO's
attainment counts it as missed.

Invariants: percentiles are nearest-rank over exact integers (the p-th percentile of n values is
the ceil(p*n/100)-th smallest), so the report is the same on every machine; nothing here changes
how a request fares.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from llmgw_twin.control.model import ModelName
from llmgw_twin.twin.scenario.workload_model import SloExpectation
from llmgw_twin.twin.world.expect import Clock, Outcome
from llmgw_twin.units import fmt_ms

PERCENTILES = (50, 90, 99)
BUCKETS = 48
"""The report's TTFT and goodput over time: the run cut in this many equal spans of arrival."""


@dataclass(frozen=True, slots=True)
class Sample:
    arrived_ms: int
    ttft_us: int
    e2e_us: int
    queued_us: int
    tbt_us: int


def percentile(values: Sequence[int], p: int) -> int:
    """Nearest rank over `values` (sorted); 0 when there are none."""
    if not values:
        return 0
    return values[max(0, -(-p * len(values) // 100) - 1)]


def _ms(us: int) -> float:
    return us / 1000


def _summary(values: list[int]) -> dict[str, float]:
    values.sort()
    out = {f"p{p}": _ms(percentile(values, p)) for p in PERCENTILES}
    out["max"] = _ms(values[-1]) if values else 0.0
    return out


@dataclass(slots=True)
class Latencies:
    """Every served request's times, per model."""

    samples: dict[ModelName, list[Sample]] = field(default_factory=dict)

    def add(self, model: ModelName, sample: Sample) -> None:
        self.samples.setdefault(model, []).append(sample)

    def of(self, model: ModelName, start_ms: int, end_ms: int) -> list[Sample]:
        return [s for s in self.samples.get(model, []) if start_ms <= s.arrived_ms <= end_ms]

    def report(
        self,
        arrivals: dict[ModelName, list[int]],
        duration_ms: int,
        slos: Sequence[SloExpectation],
    ) -> dict[str, dict[str, object]]:
        """Per model with traffic: served, TTFT, end-to-end, queueing and between-token
        percentiles in ms, and goodput: requests a second served within the model's first-token
        deadline (its `slo` expectations' tightest `ttft`; every served one without)."""
        out: dict[str, dict[str, object]] = {}
        for model in sorted(arrivals):
            got = self.samples.get(model, [])
            deadlines = [s.ttft_ms for s in slos if s.model == model and s.ttft_ms is not None]
            deadline_us = min(deadlines) * 1000 if deadlines else None
            good = sum(1 for s in got if deadline_us is None or s.ttft_us <= deadline_us)
            seconds = Fraction(max(duration_ms, 1), 1000)
            out[model] = {
                "served": len(got),
                "over_time": _over_time(got, duration_ms, deadline_us),
                "ttft_ms": _summary([s.ttft_us for s in got]),
                "e2e_ms": _summary([s.e2e_us for s in got]),
                "queued_ms": _summary([s.queued_us for s in got]),
                "tbt_ms": _summary([s.tbt_us for s in got]),
                "goodput_per_s": round(float(good / seconds), 3),
                "ttft_deadline_ms": None if deadline_us is None else deadline_us // 1000,
            }
        return out


def _over_time(got: list[Sample], duration_ms: int, deadline_us: int | None) -> dict[str, object]:
    """Per span of arrival time: the TTFT p99 (ms) of the served requests that arrived in it,
    and the goodput of that span (requests a second served within the deadline)."""
    width = max(1, -(-(duration_ms + 1) // BUCKETS))
    spans: list[list[int]] = [[] for _ in range(BUCKETS)]
    for s in got:
        spans[min(BUCKETS - 1, s.arrived_ms // width)].append(s.ttft_us)
    good = [sum(1 for t in ttfts if deadline_us is None or t <= deadline_us) for ttfts in spans]
    return {
        "span_ms": width,
        "ttft_p99_ms": [_ms(percentile(sorted(ttfts), 99)) for ttfts in spans],
        "goodput_per_s": [round(g * 1000 / width, 3) for g in good],
    }


def judge_slo(
    exp: SloExpectation,
    latencies: Latencies,
    arrivals: list[int],
    failed_at: list[int],
    clock: Clock = fmt_ms,
) -> Outcome:
    """`arrivals`, `failed_at`: the arrival times of every request to the model and of the failed
    ones. Attainment is over the requests that ended (served or failed): one still unanswered
    when the run ends is left out (it may yet make its deadline)."""
    window = f"[{clock(exp.start_ms)}, {clock(exp.end_ms)}]"
    sent = sum(1 for t in arrivals if exp.start_ms <= t <= exp.end_ms)
    got = latencies.of(exp.model, exp.start_ms, exp.end_ms)
    failed = sum(1 for t in failed_at if exp.start_ms <= t <= exp.end_ms)
    ended = len(got) + failed
    ttfts = sorted(s.ttft_us for s in got)
    e2es = sorted(s.e2e_us for s in got)
    parts: list[str] = []
    passed = True
    if exp.ttft_p99_ms is not None:
        p99 = percentile(ttfts, 99)
        ok = p99 <= exp.ttft_p99_ms * 1000
        passed &= ok
        parts.append(
            f"TTFT p99 {_ms(p99):g} ms ({'within' if ok else 'over'} {exp.ttft_p99_ms} ms)"
        )
    if exp.e2e_p99_ms is not None:
        p99 = percentile(e2es, 99)
        ok = p99 <= exp.e2e_p99_ms * 1000
        passed &= ok
        parts.append(
            f"end-to-end p99 {_ms(p99):g} ms ({'within' if ok else 'over'} {exp.e2e_p99_ms} ms)"
        )
    if exp.attainment is not None and exp.ttft_ms is not None:
        met = sum(1 for t in ttfts if t <= exp.ttft_ms * 1000)
        share = Fraction(met, ended) if ended else Fraction(1)
        ok = share >= exp.attainment
        passed &= ok
        parts.append(
            f"{met} of {ended} ended served with a first token within {exp.ttft_ms} ms "
            f"({float(share) * 100:.2f}%, at least {float(exp.attainment) * 100:g}%)"
        )
    message = (
        f"{len(got)} of {sent} requests arriving in {window} served, {failed} failed; "
        + "; ".join(parts)
    )
    return Outcome(exp.text, exp.line, passed, message)
