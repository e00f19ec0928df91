"""Calibration's arithmetic: the engine model's coefficients fitted to measurements, and the
model's prediction of a measured load, with the error between them.

Role: pure functions over plain records (no I/O), so the method is the same whatever engine was
measured: llama.cpp's `llama-server`, vLLM or SGLang, or the sim engine.

- `fit`: least squares (numpy) over two kinds of observation. A lone request's time to first
  token is one prefill iteration plus what the client's request and the server's HTTP cost
  (`o`, fitted apart: it is not the engine's): `a + b * prompt + o`. A request's mean time
  between tokens while `k` requests decode together is one decode iteration: `a + c * k`. Both
  rows constrain `a`.
- `predict`: the measured requests' arrivals and token counts replayed through `BatchEngine`
  with the fitted coefficients, `o` added to each request's times; `errors` compares the
  predicted and measured percentiles.

Invariants: coefficients are never negative (a negative least-squares estimate is clamped to 0
and the rest refitted); percentiles are nearest-rank, as the twin's report.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from llmgw_twin.engines.perf.model import BatchEngine, EnginePerf


@dataclass(frozen=True, slots=True)
class Measured:
    """One request as a client saw it, in microseconds from the load's start."""

    arrived_us: int
    prompt_tokens: int
    output_tokens: int
    ttft_us: int
    e2e_us: int
    decoding_with: int = 1
    """How many requests decoded beside it (itself included) while it produced its tokens."""

    @property
    def tbt_us(self) -> int:
        if self.output_tokens <= 1:
            return 0
        return (self.e2e_us - self.ttft_us) // (self.output_tokens - 1)


@dataclass(frozen=True, slots=True)
class Fitted:
    perf: EnginePerf
    overhead_us: int
    """`o`: what a request costs outside the engine (the client, HTTP, the server's parsing)."""


def fit(
    prefills: Sequence[Measured],
    decodes: Sequence[Measured],
    max_batch: int,
    kv_tokens: int,
    name: str = "calibrated",
) -> Fitted:
    """Coefficients from lone requests' first tokens (`prefills`) and batches' between-token
    times (`decodes`)."""
    rows: list[tuple[float, float, float, float]] = []
    values: list[float] = []
    # the median of each setting's repeats: one slow request (a page fault, a busy core) must
    # not pull the line
    for prompt, ttft in _medians((m.prompt_tokens, m.ttft_us) for m in prefills):
        rows.append((1.0, float(prompt), 0.0, 1.0))
        values.append(ttft)
    for k, tbt in _medians((m.decoding_with, m.tbt_us) for m in decodes if m.output_tokens > 1):
        rows.append((1.0, 0.0, float(k), 0.0))
        values.append(tbt)
    if len(rows) < 4:
        raise ValueError(
            "too few settings to fit four coefficients (at least two prompt lengths and two "
            "batch sizes)"
        )
    x, y = np.array(rows), np.array(values)
    free = [0, 1, 2, 3]
    coef = np.zeros(4)
    while free:
        solution, *_ = np.linalg.lstsq(x[:, free], y, rcond=None)
        coef = np.zeros(4)
        coef[free] = solution
        negative = [i for i in free if coef[i] < 0]
        if not negative:
            break
        free.remove(negative[0])
    a, b, c = (Fraction(round(float(v) * 1000), 1000) for v in coef[:3])
    if a + b + c <= 0:
        raise ValueError("the measurements show no time spent: nothing to fit")
    return Fitted(EnginePerf(name, a, b, c, max_batch, kv_tokens, "calibrated"), round(coef[3]))


def _medians(pairs: Iterable[tuple[int, int]]) -> list[tuple[int, float]]:
    groups: dict[int, list[int]] = {}
    for setting, value in pairs:
        groups.setdefault(setting, []).append(value)
    return [(k, float(np.median(v))) for k, v in sorted(groups.items())]


def predict(fitted: Fitted, load: Sequence[Measured]) -> list[tuple[int, int]]:
    """(TTFT, end-to-end) in µs for each request of `load`, in its order, as the model says
    they would go with the same arrivals and token counts."""
    perf, o = fitted.perf, fitted.overhead_us
    engine = BatchEngine(perf)
    order = sorted(range(len(load)), key=lambda i: (load[i].arrived_us, i))
    for i in order:
        m = load[i]
        prompt = min(m.prompt_tokens, max(0, perf.kv_tokens - max(1, m.output_tokens)))
        engine.submit(i, m.arrived_us, prompt, max(1, m.output_tokens))
    got: dict[int, tuple[int, int]] = {}
    while (nxt := engine.next_done_us()) is not None:
        for s in engine.advance(nxt):
            got[s.key] = (s.ttft_us + o, s.e2e_us + o)
    return [got[i] for i in range(len(load))]


def percentile(values: Sequence[int], p: int) -> int:
    ordered = sorted(values)
    if not ordered:
        return 0
    return ordered[max(0, -(-p * len(ordered) // 100) - 1)]


@dataclass(frozen=True, slots=True)
class Error:
    metric: str
    measured_ms: float
    predicted_ms: float

    @property
    def relative(self) -> float:
        if self.measured_ms == 0:
            return 0.0 if self.predicted_ms == 0 else float("inf")
        return abs(self.predicted_ms - self.measured_ms) / self.measured_ms


GOALS = {"p50": 0.10, "p99": 0.20}
"""The calibration's goal: predicted p50 within 10% of the measured, p99 within 20%."""


def errors(load: Sequence[Measured], predicted: Sequence[tuple[int, int]]) -> list[Error]:
    out: list[Error] = []
    for metric, measured, model in (
        ("ttft", [m.ttft_us for m in load], [p[0] for p in predicted]),
        ("e2e", [m.e2e_us for m in load], [p[1] for p in predicted]),
    ):
        for p in (50, 99):
            out.append(
                Error(
                    f"{metric} p{p}",
                    percentile(measured, p) / 1000,
                    percentile(model, p) / 1000,
                )
            )
    return out


def within_goals(errs: Sequence[Error]) -> bool:
    return all(e.relative <= GOALS[e.metric.split()[1]] for e in errs)
