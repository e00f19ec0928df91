"""The scenario loader's `traffic:` section: requests clients send through the router.

Role: turn `traffic:` (one mapping, or a list of them) into `Traffic` items: a deployed model,
a rate `R/s` (or `/min`, `/h`; R a decimal number) kept as an exact fraction, and the tokens
each request asks for. The project's additions (rate shapes, token lengths, a trace instead of a
rate) are read by `workload.py` into the item's `Workload`; an item without them has none.

Invariants:
- Each item names a deployed model, at most once in the whole section.
- A rate is positive and at most `MAX_RATE_PER_S`; the run's requests, all items together,
  are at most `MAX_REQUESTS` (each costs the twin a few events).
"""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path

from yaml.nodes import MappingNode, Node

from llmgw_twin.twin.scenario import yamlnodes as yn
from llmgw_twin.twin.scenario.faults import Known
from llmgw_twin.twin.scenario.limits import MAX_RATE_PER_S, MAX_REQUESTS, MAX_TOKENS
from llmgw_twin.twin.scenario.model import Traffic
from llmgw_twin.twin.scenario.workload import (
    WORKLOAD_KEYS,
    has_workload,
    load_workload,
    request_bound,
)

TRAFFIC_KEYS = ("model", "rate", "tokens")
DEFAULT_TOKENS = 32
_PER_MS = {"s": 1_000, "min": 60_000, "h": 3_600_000}
_RATE = re.compile(r"(\d{1,9}(?:\.\d{1,6})?)\s*/\s*(s|min|h)")


def load_traffic(node: Node, known: Known, base_dir: Path = Path()) -> tuple[Traffic, ...]:
    """`base_dir`: where a `trace` file is looked for (the scenario's folder)."""
    items = [node] if isinstance(node, MappingNode) else yn.items(node, "traffic")
    out: list[Traffic] = []
    seen: dict[str, None] = {}
    total = 0
    for i, item in enumerate(items):
        where = "traffic" if item is node else f"traffic[{i}]"
        view = yn.MapView(item, where)
        view.check_keys((*TRAFFIC_KEYS, *WORKLOAD_KEYS))
        model_node = view.require("model")
        model = known.model(model_node, f"{where}.model")
        if model in seen:
            raise yn.Invalid.at(
                model_node, f"{where}.model: '{model}' already has traffic (one item per model)"
            )
        seen[model] = None
        trace_node = view.get("trace")  # a trace says when requests arrive, not a rate
        rate_node = trace_node if trace_node is not None else view.require("rate")
        count, every_ms = (
            (1, 1) if trace_node is not None else parse_rate(rate_node, f"{where}.rate")
        )
        tokens_node = view.get("tokens")
        if tokens_node is None and (out_node := view.get("output_tokens")) is not None:
            tokens_node = out_node if yn.is_int(out_node) else None  # else a distribution
        tokens = (
            DEFAULT_TOKENS
            if tokens_node is None
            else yn.integer(tokens_node, f"{where}.tokens", minimum=1, maximum=MAX_TOKENS)
        )
        traffic = Traffic(model, count, every_ms, tokens, yn.line_of(item))
        if has_workload(view):
            traffic = load_workload(view, where, known, base_dir, traffic)
        total += request_bound(traffic, known.duration_ms)
        if total > MAX_REQUESTS:
            raise yn.Invalid.at(
                rate_node,
                f"{where}.rate: the run would send {total:,} requests, more than the "
                f"{MAX_REQUESTS:,} allowed (see Limits in docs/scenarios.md)",
            )
        out.append(traffic)
    return tuple(out)


def parse_rate(node: Node, where: str) -> tuple[int, int]:
    """`R/s`, `R/min` or `R/h` as (count, every_ms), reduced: `5/s` is (1, 200)."""
    text = yn.text(node, where).strip()
    match = _RATE.fullmatch(text)
    if match is None:
        raise yn.Invalid.at(
            node, f"{where}: '{yn.short(text)}' is not a rate (expected R/s, R/min or R/h: 5/s)"
        )
    rate = Fraction(match.group(1)) / _PER_MS[match.group(2)]  # requests per ms
    if rate <= 0:
        raise yn.Invalid.at(node, f"{where}: the rate must be more than 0")
    if rate * 1_000 > MAX_RATE_PER_S:
        raise yn.Invalid.at(
            node, f"{where}: {text} is more than the {MAX_RATE_PER_S:,}/s a traffic item may send"
        )
    return rate.numerator, rate.denominator
