"""When a traffic item's requests arrive and what each asks for: rate shapes and recorded traces.

Role: `arrivals(traffic, end_ms, seed)` yields every request of one item in arrival order, as
`Arrival(at_ms, input_tokens, output_tokens)`, lazily: the twin and real mode pull the next one
when the previous has arrived, so a day of traffic or a trace of millions of rows is never held.

- The contract's item (no `Workload`): request i at `Traffic.arrival_ms(i)`, `tokens` tokens.
- A rate with shapes: the rate at t is the item's rate times the diurnal level at t times every
  burst's factor at t, piecewise constant, so its integral Λ(t) is exact. Request i arrives at
  the first t where Λ(t) reaches x_i: x_i = i for `even` arrivals (the contract's spacing when
  nothing shapes the rate), the running sum of exponential draws for `poisson` (a Poisson
  process, thinned by nothing: its rate is the shaped rate at every instant).
- A trace: its rows, in file order, up to the last that arrives within the run
  (`read_trace`); the rest of the file is never read.

Invariants: deterministic: the draws come from `random.Random` streams seeded by text (the run's
seed, the model, and the stream's purpose), never from the world's stream, so traffic changes no
other draw of the run; arrivals are non-decreasing whole milliseconds within [0, end_ms].
"""

from __future__ import annotations

import csv
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from pathlib import Path

from llmgw_twin.twin.scenario.limits import MAX_TOKENS
from llmgw_twin.twin.scenario.model import Traffic
from llmgw_twin.twin.scenario.workload_model import DEFAULT_INPUT_TOKENS, Workload

TIME_COLUMNS = {"arrival_ms": 1, "timestamp": 1, "arrival_s": 1000, "Timestamp": 1000}
"""A trace's arrival column, and how many milliseconds its unit is (Mooncake's `timestamp` is in
ms; BurstGPT's `Timestamp` in seconds)."""
INPUT_COLUMNS = ("input_tokens", "input_length", "prompt_tokens", "ContextTokens", "Request tokens")
OUTPUT_COLUMNS = (
    "output_tokens",
    "output_length",
    "completion_tokens",
    "GeneratedTokens",
    "Response tokens",
)


@dataclass(frozen=True, slots=True)
class Arrival:
    at_ms: int
    input_tokens: int
    output_tokens: int


class TraceError(Exception):
    """A trace row that cannot be read: its file and line."""

    def __init__(self, path: str, line: int, message: str) -> None:
        super().__init__(path, line, message)
        self.path = path
        self.line = line
        self.message = message

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


# --- the rate ------------------------------------------------------------------------------------


def _rate_at(base: Fraction, wl: Workload, t: Fraction) -> Fraction:
    rate = base
    if wl.diurnal is not None:
        parts = len(wl.diurnal.levels)
        part = int(t * parts // wl.diurnal.period_ms) % parts
        rate *= wl.diurnal.levels[part]
    for burst in wl.bursts:
        if burst.start_ms <= t < burst.end_ms:
            rate *= burst.factor
    return rate


def _next_change(wl: Workload, t: Fraction) -> Fraction | None:
    """The first instant after t where the rate may change; None: never."""
    changes: list[Fraction] = []
    if wl.diurnal is not None:
        width = Fraction(wl.diurnal.period_ms, len(wl.diurnal.levels))
        changes.append(width * (t // width + 1))
    changes += [Fraction(b) for burst in wl.bursts for b in (burst.start_ms, burst.end_ms) if b > t]
    return min(changes, default=None)


def expected_requests(traffic: Traffic, wl: Workload, end_ms: int) -> Fraction:
    """Λ(end_ms + 1): the requests an `even` item sends in [0, end_ms] (a Poisson one's mean)."""
    base = Fraction(traffic.count, traffic.every_ms)
    t, total, end = Fraction(0), Fraction(0), Fraction(end_ms + 1)
    while t < end:
        nxt = min(_next_change(wl, t) or end, end)
        total += (nxt - t) * _rate_at(base, wl, t)
        t = nxt
    return total


def _times(traffic: Traffic, wl: Workload, end_ms: int, rng: random.Random) -> Iterator[int]:
    base = Fraction(traffic.count, traffic.every_ms)
    poisson = wl.arrivals == "poisson"
    x = Fraction(rng.expovariate(1.0)) if poisson else Fraction(0)
    t, done, end = Fraction(0), Fraction(0), Fraction(end_ms + 1)
    while t < end:
        nxt = min(_next_change(wl, t) or end, end)
        rate = _rate_at(base, wl, t)
        if rate > 0:
            reach = done + (nxt - t) * rate
            while x < reach:
                yield int(t + (x - done) / rate)
                x += Fraction(rng.expovariate(1.0)) if poisson else 1
            done = reach
        t = nxt


# --- traces --------------------------------------------------------------------------------------


def _number(text: object, path: str, line: int, column: str) -> Decimal:
    try:
        value = Decimal(str(text).strip())
    except InvalidOperation:
        value = Decimal("NaN")
    if not value.is_finite() or value < 0 or isinstance(text, bool):
        raise TraceError(
            path, line, f"column {column}: '{str(text)[:40]}' is not a number 0 or more"
        )
    return value


def _tokens(text: object, path: str, line: int, column: str, minimum: int) -> int:
    value = _number(text, path, line, column)
    if value != value.to_integral_value() or not minimum <= value <= MAX_TOKENS:
        raise TraceError(
            path,
            line,
            f"column {column}: '{str(text)[:40]}' is not a whole number of tokens from "
            f"{minimum} to {MAX_TOKENS:,}",
        )
    return int(value)


def _pick(names: list[str], wanted: tuple[str, ...] | list[str], path: str, what: str) -> str:
    for name in wanted:
        if name in names:
            return name
    raise TraceError(
        path,
        1,
        f"no {what} column (expected one of: {', '.join(wanted)}; found: "
        f"{', '.join(names[:12]) or 'none'})",
    )


def _rows(path: str, shown: str) -> Iterator[tuple[int, dict[str, object]]]:
    """(line, row) pairs of a CSV (with a header) or JSON-lines file, read as it goes."""
    try:
        with Path(path).open(encoding="utf-8", newline="") as file:
            if path.endswith(".csv"):
                reader = csv.DictReader(file)
                for row in reader:
                    if None in row or None in row.values():
                        raise TraceError(
                            shown, reader.line_num, "the row's cells do not match the header's"
                        )
                    yield reader.line_num, dict(row)
                if reader.fieldnames is None:
                    raise TraceError(shown, 1, "the file is empty (expected a header row)")
                return
            for number, text in enumerate(file, start=1):
                if not text.strip():
                    continue
                try:
                    row = json.loads(text)
                except ValueError as err:
                    raise TraceError(shown, number, f"not a JSON object: {err}") from None
                if not isinstance(row, dict):
                    raise TraceError(shown, number, "not a JSON object")
                yield number, row
    except OSError as err:
        raise TraceError(shown, 1, f"cannot read the trace: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise TraceError(shown, 1, f"not UTF-8 text ({err.reason})") from None
    except csv.Error as err:
        raise TraceError(shown, 1, f"not CSV: {err}") from None


def read_trace(
    path: str, shown: str, end_ms: int, scale: Fraction = Fraction(1)
) -> Iterator[Arrival]:
    """Every row that arrives within [0, end_ms] (its time multiplied by `scale`), checked as it
    is read; `TraceError` names the file (as `shown`) and line of the first bad one. Stops at the
    first row past the end."""
    columns: tuple[str, str, str] | None = None
    last = 0
    for line, row in _rows(path, shown):
        if columns is None:
            names = list(row)
            columns = (
                _pick(names, list(TIME_COLUMNS), shown, "arrival time"),
                _pick(names, INPUT_COLUMNS, shown, "input tokens"),
                _pick(names, OUTPUT_COLUMNS, shown, "output tokens"),
            )
        time_col, in_col, out_col = columns
        for col in columns:
            if col not in row:
                raise TraceError(shown, line, f"no {col} in this row")
        exact = _number(row[time_col], shown, line, time_col) * TIME_COLUMNS[time_col]
        at = int(Fraction(exact) * scale)
        if at < last:
            raise TraceError(
                shown,
                line,
                f"arrives at {at} ms, before the row above it ({last} ms): rows "
                "must be in arrival order",
            )
        last = at
        if at > end_ms:
            return
        yield Arrival(
            at,
            _tokens(row[in_col], shown, line, in_col, 0),
            _tokens(row[out_col], shown, line, out_col, 1),
        )


# --- one item's requests -------------------------------------------------------------------------


def arrivals(traffic: Traffic, end_ms: int, seed: int | str) -> Iterator[Arrival]:
    """Every request of `traffic` in [0, end_ms], in arrival order."""
    wl = traffic.workload
    if wl is None:
        for i in range(traffic.requests_until(end_ms)):
            yield Arrival(traffic.arrival_ms(i), DEFAULT_INPUT_TOKENS, traffic.tokens)
        return
    if wl.trace is not None:
        yield from read_trace(wl.trace.path, wl.trace.shown, end_ms, wl.trace.scale)
        return
    times = _times(traffic, wl, end_ms, random.Random(f"{seed}/{traffic.model}/arrivals"))
    lengths = random.Random(f"{seed}/{traffic.model}/tokens")
    for at in times:
        prompt = wl.input_tokens.draw(lengths)
        yield Arrival(at, prompt, wl.output_tokens.draw(lengths))
