"""What a scenario says about its load, as values: how requests arrive, how long their prompts and
answers are, recorded traces, the engines' performance model, and latency objectives.

Role: the typed results of `workload.py` (the loader of these keys), read by the twin's traffic
(`twin/world/traffic.py`), the arrivals generator (`arrivals.py`) and real mode's clients.

Invariants:
- Values only: frozen, exact (`Fraction` rates and shares, integer milliseconds and tokens).
- A `Traffic` without a `Workload` is the contract's `{model, rate, tokens}` item and runs
  exactly as before these keys existed.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from fractions import Fraction

from llmgw_twin.control.model import ModelName, ProfileName
from llmgw_twin.engines.perf.model import EnginePerf

DEFAULT_INPUT_TOKENS = 16
"""A request's prompt when the item says nothing of it (the contract's form only says `tokens`,
the answer's length)."""


@dataclass(frozen=True, slots=True)
class Lengths:
    """A token count per request: `fixed`, `uniform` over [low, high], or `lognormal` with its
    median and sigma, clamped to [low, high]."""

    kind: str
    low: int
    high: int
    median: int = 0
    sigma: Fraction = Fraction(0)

    @classmethod
    def fixed(cls, tokens: int) -> Lengths:
        return cls("fixed", tokens, tokens)

    def draw(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            return self.low
        if self.kind == "uniform":
            return rng.randint(self.low, self.high)
        value = rng.lognormvariate(math.log(self.median), float(self.sigma))
        return min(self.high, max(self.low, round(value)))

    @property
    def text(self) -> str:
        if self.kind == "fixed":
            return str(self.low)
        if self.kind == "uniform":
            return f"uniform [{self.low}, {self.high}]"
        return f"lognormal median {self.median} sigma {self.sigma} in [{self.low}, {self.high}]"


_DEFAULT_INPUT = Lengths.fixed(DEFAULT_INPUT_TOKENS)
_DEFAULT_OUTPUT = Lengths.fixed(32)


@dataclass(frozen=True, slots=True)
class Burst:
    """The rate is `factor` times what it would be, from `start_ms` (included) to `end_ms`."""

    start_ms: int
    end_ms: int
    factor: Fraction


@dataclass(frozen=True, slots=True)
class Diurnal:
    """The rate follows a daily (or any `period_ms`) profile: `levels[k]` times the rate over the
    k-th of `len(levels)` equal parts of the period, from the run's start."""

    period_ms: int
    levels: tuple[Fraction, ...]


@dataclass(frozen=True, slots=True)
class TraceFile:
    """A recorded trace: one request per row, its arrival, prompt and answer tokens."""

    path: str
    """Where it is read from (resolved against the scenario's folder)."""
    shown: str
    """As the scenario wrote it."""
    requests: int
    """Rows that arrive within the run (counted when the scenario was loaded)."""
    scale: Fraction = Fraction(1)
    """Every arrival time is multiplied by this (a run scaled in time scales its trace too)."""


@dataclass(frozen=True, slots=True)
class Workload:
    """How one traffic item's requests arrive and what they ask for."""

    arrivals: str = "even"
    """`even` (the contract's evenly spaced arrivals) or `poisson`."""
    diurnal: Diurnal | None = None
    bursts: tuple[Burst, ...] = ()
    input_tokens: Lengths = _DEFAULT_INPUT
    output_tokens: Lengths = _DEFAULT_OUTPUT
    trace: TraceFile | None = None
    """Replayed instead of a rate: arrivals and tokens come from the file."""


@dataclass(frozen=True, slots=True)
class EngineModel:
    """A profile's replicas serve with this performance model (`engine_model:`)."""

    profile: ProfileName
    perf: EnginePerf
    line: int = 0


@dataclass(frozen=True, slots=True)
class SloExpectation:
    """Of the requests to `model` that arrive in [start_ms, end_ms]: the 99th percentile of the
    served ones' time to first token is at most `ttft_p99_ms` (and of end-to-end latency at most
    `e2e_p99_ms`), and at least `attainment` of all of them were served with a first token
    within `ttft_ms`. Absent parts are None."""

    model: ModelName
    start_ms: int
    end_ms: int
    ttft_p99_ms: int | None = None
    e2e_p99_ms: int | None = None
    ttft_ms: int | None = None
    attainment: Fraction | None = None
    line: int = 0
    text: str = ""
