"""The scenario loader's keys for load as users send it (the project's additions): a traffic
item's `arrivals`, `diurnal`, `bursts`, `input_tokens`, `output_tokens` and `trace`; the
top-level `engine_model`; and the `slo` expectation. `docs/scenarios.md` and
`docs/engine-model.md` describe them.

Invariants: every refusal names the offending value's line and column in the scenario, and a
trace's refusal also names the trace file and its line; a trace is checked once here, row by row
as it is read (never held whole), up to its last row within the run.
"""

from __future__ import annotations

import re
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

from yaml.nodes import MappingNode, Node

from llmgw_twin import units
from llmgw_twin.control.model import ModelName, Profile, ProfileName
from llmgw_twin.engines.perf.model import EnginePerf
from llmgw_twin.engines.perf.table import TABLE, perf_arg
from llmgw_twin.twin.scenario import yamlnodes as yn
from llmgw_twin.twin.scenario.arrivals import TraceError, expected_requests, read_trace
from llmgw_twin.twin.scenario.faults import Known
from llmgw_twin.twin.scenario.limits import (
    MAX_BURSTS,
    MAX_LEVELS,
    MAX_REQUESTS,
    MAX_TOKENS,
)
from llmgw_twin.twin.scenario.limits import MAX_RATE_FACTOR as MAX_FACTOR
from llmgw_twin.twin.scenario.model import Traffic
from llmgw_twin.twin.scenario.workload_model import (
    Burst,
    Diurnal,
    EngineModel,
    Lengths,
    SloExpectation,
    TraceFile,
    Workload,
)

WORKLOAD_KEYS = ("arrivals", "diurnal", "bursts", "input_tokens", "output_tokens", "trace")
PERF_KEYS = ("base", "iteration_us", "prefill_us_per_token", "decode_us_per_token")
PERF_COUNTS = ("max_batch", "kv_tokens")
SLO_KEYS = ("model", "ttft_p99", "e2e_p99", "ttft", "attainment")
_NUMBER = re.compile(r"\d{1,12}(?:\.\d{1,9})?")


def _number(node: Node, where: str, positive: bool = False, maximum: int | None = None) -> Fraction:
    text = yn.text(node, where).strip()
    if not _NUMBER.fullmatch(text):
        raise yn.Invalid.at(node, f"{where}: '{yn.short(text)}' is not a number (e.g. 2 or 0.25)")
    value = Fraction(text)
    if positive and value <= 0:
        raise yn.Invalid.at(node, f"{where} must be more than 0")
    if maximum is not None and value > maximum:
        raise yn.Invalid.at(node, f"{where} must be at most {maximum:,}")
    return value


# --- traffic ---------------------------------------------------------------------------------


def has_workload(view: yn.MapView) -> bool:
    return any(view.has(k) for k in WORKLOAD_KEYS)


def load_lengths(node: Node, where: str, minimum: int) -> Lengths:
    """`N`, `{uniform: [LOW, HIGH]}` or `{lognormal: {median, sigma}, min, max}`."""
    if yn.is_int(node):
        return Lengths.fixed(yn.integer(node, where, minimum=minimum, maximum=MAX_TOKENS))
    view = yn.MapView(node, where)
    view.check_keys(("uniform", "lognormal", "min", "max"))
    if view.has("uniform"):
        view.check_keys(("uniform",), "only 'uniform: [LOW, HIGH]'")
        bounds = yn.items(view.require("uniform"), f"{where}.uniform")
        if len(bounds) != 2:
            raise yn.Invalid.at(view.require("uniform"), f"{where}.uniform must be [LOW, HIGH]")
        low, high = (
            yn.integer(b, f"{where}.uniform[{i}]", minimum=minimum, maximum=MAX_TOKENS)
            for i, b in enumerate(bounds)
        )
        if low > high:
            raise yn.Invalid.at(bounds[1], f"{where}.uniform: HIGH is below LOW")
        return Lengths("uniform", low, high)
    body = yn.MapView(view.require("lognormal"), f"{where}.lognormal")
    body.check_keys(("median", "sigma"))
    median = yn.integer(body.require("median"), f"{where}.lognormal.median", 1, MAX_TOKENS)
    sigma = _number(body.require("sigma"), f"{where}.lognormal.sigma", maximum=10)
    low_node, high_node = view.get("min"), view.get("max")
    low = minimum if low_node is None else yn.integer(low_node, f"{where}.min", minimum, MAX_TOKENS)
    high = (
        MAX_TOKENS if high_node is None else yn.integer(high_node, f"{where}.max", low, MAX_TOKENS)
    )
    return Lengths("lognormal", low, high, median, sigma)


def load_workload(
    view: yn.MapView, where: str, known: Known, base_dir: Path, traffic: Traffic
) -> Traffic:
    """`traffic` with the item's workload keys read into its `Workload`."""
    trace_node = view.get("trace")
    if trace_node is not None:
        for key in ("rate", "tokens", *WORKLOAD_KEYS):
            if key != "trace" and view.has(key):
                raise yn.Invalid.at(
                    view.entry(key).key_node,
                    f"{where}: '{key}' cannot be set with 'trace' (the trace says when each "
                    "request arrives and how many tokens it has)",
                )
        return replace(traffic, workload=Workload(trace=_trace(trace_node, where, known, base_dir)))
    if view.has("tokens") and view.has("output_tokens"):
        raise yn.Invalid.at(
            view.entry("output_tokens").key_node,
            f"{where}: 'output_tokens' and 'tokens' say the same thing; keep one",
        )
    wl = Workload(output_tokens=Lengths.fixed(traffic.tokens))
    if (node := view.get("arrivals")) is not None:
        wl = replace(
            wl, arrivals=yn.choice(node, f"{where}.arrivals", ("even", "poisson"), "arrivals")
        )
    if (node := view.get("diurnal")) is not None:
        wl = replace(wl, diurnal=_diurnal(node, f"{where}.diurnal"))
    if (node := view.get("bursts")) is not None:
        wl = replace(wl, bursts=_bursts(node, f"{where}.bursts", known))
    if (node := view.get("input_tokens")) is not None:
        wl = replace(wl, input_tokens=load_lengths(node, f"{where}.input_tokens", 0))
    if (node := view.get("output_tokens")) is not None:
        wl = replace(wl, output_tokens=load_lengths(node, f"{where}.output_tokens", 1))
    return replace(traffic, workload=wl)


def _diurnal(node: Node, where: str) -> Diurnal:
    view = yn.MapView(node, where)
    view.check_keys(("period", "levels"))
    period_node = view.get("period")
    period = (
        86_400_000 if period_node is None else yn.duration(period_node, f"{where}.period", True)
    )
    levels_node = view.require("levels")
    levels = tuple(
        _number(n, f"{where}.levels[{i}]", maximum=MAX_FACTOR)
        for i, n in enumerate(yn.items(levels_node, f"{where}.levels", MAX_LEVELS))
    )
    if not any(levels):
        raise yn.Invalid.at(levels_node, f"{where}.levels: at least one level must be above 0")
    return Diurnal(period, levels)


def _bursts(node: Node, where: str, known: Known) -> tuple[Burst, ...]:
    out: list[Burst] = []
    for i, item in enumerate(yn.items(node, where, MAX_BURSTS)):
        view = yn.MapView(item, f"{where}[{i}]")
        view.check_keys(("at", "for", "factor"))
        _, start = known.time(view.require("at"), f"{where}[{i}].at")
        length = yn.duration(view.require("for"), f"{where}[{i}].for", positive=True)
        factor = _number(view.require("factor"), f"{where}[{i}].factor", maximum=MAX_FACTOR)
        out.append(Burst(start, start + length, factor))
    return tuple(out)


def _trace(node: Node, where: str, known: Known, base_dir: Path) -> TraceFile:
    shown = yn.text(node, f"{where}.trace")
    path = base_dir / shown
    if not (shown.endswith(".csv") or shown.endswith(".jsonl") or shown.endswith(".ndjson")):
        raise yn.Invalid.at(
            node, f"{where}.trace: '{yn.short(shown)}' must be a .csv or .jsonl file"
        )
    count = 0
    try:
        for _ in read_trace(str(path), shown, known.duration_ms):
            count += 1
            if count > MAX_REQUESTS:
                raise yn.Invalid.at(
                    node,
                    f"{where}.trace: more than {MAX_REQUESTS:,} requests arrive within the run "
                    "(see Limits in docs/scenarios.md)",
                )
    except TraceError as err:
        raise yn.Invalid.at(node, f"{where}.trace: {err}") from None
    return TraceFile(str(path), shown, count)


def request_bound(traffic: Traffic, duration_ms: int) -> int:
    """How many requests the item sends in the run (a Poisson item: its mean)."""
    wl = traffic.workload
    if wl is None:
        return traffic.requests_until(duration_ms)
    if wl.trace is not None:
        return wl.trace.requests
    total = expected_requests(traffic, wl, duration_ms)
    return -(-total.numerator // total.denominator)


# --- engine_model ----------------------------------------------------------------------------


def load_engine_model(node: Node, known: Known) -> tuple[EngineModel, ...]:
    """`engine_model: {PROFILE: ENTRY | {base, iteration_us, ..., kv_tokens}}`."""
    view = yn.MapView(node, "engine_model")
    out: list[EngineModel] = []
    for entry in view.entries:
        where = f"engine_model.{entry.key}"
        if entry.key not in known.profiles:
            raise yn.Invalid.at(
                entry.key_node,
                f"{where}: unknown profile '{yn.short(entry.key)}' "
                f"(known: {yn.preview(list(known.profiles))})",
            )
        out.append(
            EngineModel(
                ProfileName(entry.key), _perf(entry.value, where), yn.line_of(entry.key_node)
            )
        )
    return tuple(out)


def with_perf_args(
    profiles: tuple[Profile, ...], models: tuple[EngineModel, ...]
) -> tuple[Profile, ...]:
    """Each `sim` profile with an engine model gets `--perf-model` among its args, so that the
    runnable sim engine (real mode) answers as the twin's model does; other engines have their
    own pace."""
    perf = {m.profile: m.perf for m in models}
    return tuple(
        replace(p, args=(*p.args, "--perf-model", perf_arg(perf[p.name])))
        if p.engine == "sim" and p.name in perf
        else p
        for p in profiles
    )


def _entry(node: Node, where: str) -> EnginePerf:
    name = yn.text(node, where)
    if name not in TABLE:
        raise yn.Invalid.at(
            node,
            f"{where}: no engine performance entry '{yn.short(name)}' (known: {', '.join(TABLE)})",
        )
    return TABLE[name]


def _perf(node: Node, where: str) -> EnginePerf:
    if not isinstance(node, MappingNode):
        return _entry(node, where)
    view = yn.MapView(node, where)
    view.check_keys((*PERF_KEYS, *PERF_COUNTS))
    base_node = view.get("base")
    if base_node is None:
        missing = [k for k in (*PERF_KEYS[1:], *PERF_COUNTS) if not view.has(k)]
        if missing:
            raise yn.Invalid.at(node, f"{where}: without 'base' it needs {', '.join(missing)} too")
        perf = EnginePerf(where, Fraction(0), Fraction(0), Fraction(1), 1, 1, "the scenario")
    else:
        perf = _entry(base_node, f"{where}.base")
    changes: dict[str, object] = {}
    for key in PERF_KEYS[1:]:
        if (value := view.get(key)) is not None:
            changes[key] = _number(value, f"{where}.{key}", maximum=10**9)
    for key in PERF_COUNTS:
        if (value := view.get(key)) is not None:
            changes[key] = yn.integer(value, f"{where}.{key}", minimum=1, maximum=10**12)
    if not changes:
        return perf
    name = perf.name if base_node is not None else "custom"
    try:
        return replace(perf, name=f"{name} (as {where} sets)", source="the scenario", **changes)  # type: ignore[arg-type]
    except ValueError as err:
        raise yn.Invalid.at(node, f"{where}: {err}") from None


# --- the slo expectation ---------------------------------------------------------------------


def load_slo(node: Node, where: str, known: Known, window: tuple[int, int, str]) -> SloExpectation:
    """`slo: {model, ttft_p99, e2e_p99, ttft, attainment}`; `window`: (start, end, as written)."""
    body = yn.MapView(node, f"{where}.slo")
    body.check_keys(SLO_KEYS)
    model_node = body.require("model")
    model = known.model(model_node, f"{where}.slo.model")
    if model not in known.traffic:
        raise yn.Invalid.at(
            model_node,
            f"{where}.slo.model: no traffic is sent to '{model}' (add it under traffic:)",
        )
    times = {
        k: yn.duration(n, f"{where}.slo.{k}", positive=True)
        for k in ("ttft_p99", "e2e_p99", "ttft")
        if (n := body.get(k)) is not None
    }
    attainment: Fraction | None = None
    if (share := body.get("attainment")) is not None:
        try:
            attainment = Fraction(
                units.parse_share(yn.text(share, f"{where}.slo.attainment"))
            ).limit_denominator(10**6)
        except ValueError as err:
            raise yn.Invalid.at(share, f"{where}.slo.attainment: {err}") from None
        if not 0 < attainment <= 1:
            raise yn.Invalid.at(share, f"{where}.slo.attainment must be above 0 and at most 100%")
        if "ttft" not in times and "ttft_p99" not in times:
            raise yn.Invalid.at(
                share,
                f"{where}.slo.attainment needs 'ttft' (or 'ttft_p99'): the first token's deadline",
            )
    if not times and attainment is None:
        raise yn.Invalid.at(
            body.node, f"{where}.slo needs at least one of ttft_p99, e2e_p99, attainment"
        )
    parts = [f"{k}={units.fmt_ms(v)}" for k, v in times.items()]
    if attainment is not None:
        parts.append(f"attainment={float(attainment) * 100:g}%")
    start, end, written = window
    return SloExpectation(
        model=ModelName(model),
        start_ms=start,
        end_ms=end,
        ttft_p99_ms=times.get("ttft_p99"),
        e2e_p99_ms=times.get("e2e_p99"),
        ttft_ms=times.get("ttft", times.get("ttft_p99"))
        if attainment is not None
        else times.get("ttft"),
        attainment=attainment,
        line=yn.line_of(body.node),
        text=f"slo model={model} {' '.join(parts)}{written}",
    )
