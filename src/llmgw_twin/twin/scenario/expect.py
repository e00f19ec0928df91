"""The scenario loader's `expect:` section: event windows, state assertions, request counts.

Role: turn each item of `expect:` into an `EventExpectation` (an `event:` item), a
`StateExpectation` (an `at:` item) or a `RequestsExpectation` (a `requests:` item), with times
resolved against the run and the faults, and a one-line `text` rendering that uses the time
expressions as written.

Invariants:
- An item is exactly one of the three kinds; a `requests` item names a model with traffic; a
  window is two times with from <= to, both inside the run; `never` and `count` exclude each
  other; a state item asserts something.
- Filters and assertions name only nodes, fabrics, deployed models and fault ids that exist.
- Filters are stored sorted by subject (a canonical form); assertions and `text` keep file order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from yaml.nodes import Node

from llmgw_twin.control.model import FabricId, ModelName, NodeId, NodeState
from llmgw_twin.twin.scenario import yamlnodes as yn
from llmgw_twin.twin.scenario.faults import Known
from llmgw_twin.twin.scenario.limits import (
    MAX_COUNT,
    MAX_EXPECTATIONS,
    MAX_REPLICAS,
    MAX_REQUESTS,
    MAX_SHARDS_PER_REPLICA,
)
from llmgw_twin.twin.scenario.model import (
    EVENT_KINDS,
    EVENT_SUBJECTS,
    EventExpectation,
    Expectation,
    RequestsExpectation,
    StateExpectation,
)
from llmgw_twin.twin.scenario.workload import load_slo
from llmgw_twin.units import fmt_ms

LIST_SUBJECTS = ("nodes", "argv")
"""Subjects whose values are lists in the trace; they cannot be compared to one value."""
FILTERS = tuple(s for s in EVENT_SUBJECTS if s not in LIST_SUBJECTS)
EVENT_KEYS = ("event", "within", "never", "count", "at_most")
STATE_KEYS = ("ready_replicas", "idle_nodes", "node_state", "replicas_in", "leader", "leaders")
NODE_STATES = tuple(state.value for state in NodeState)

_T = TypeVar("_T", bound=str)


def load_expectations(node: Node, known: Known) -> tuple[Expectation, ...]:
    out: list[Expectation] = []
    for i, item in enumerate(yn.items(node, "expect", MAX_EXPECTATIONS)):
        where = f"expect[{i}]"
        view = yn.MapView(item, where)
        kinds = [view.entry(k).key_node for k in ("event", "at", "requests", "slo") if view.has(k)]
        if len(kinds) > 1:
            raise yn.Invalid.at(
                max(kinds, key=yn.line_col),
                f"{where} has more than one of 'event', 'at' and 'requests' (or 'slo'): an item "
                "checks events in a window, the state at a time, the requests that failed, or "
                "their latency",
            )
        if view.has("event"):
            out.append(_event(view, where, known))
        elif view.has("at"):
            out.append(_state(view, where, known))
        elif view.has("requests"):
            out.append(_requests(view, where, known))
        elif view.has("slo"):
            view.check_keys(("slo", "within"))
            window = (0, known.duration_ms, "")
            if view.has("within"):
                start_ms, end_ms, first, last = _window(view, where, known)
                window = (start_ms, end_ms, f" within [{first}, {last}]")
            out.append(load_slo(view.require("slo"), where, known, window))
        else:
            raise yn.Invalid.at(
                item,
                f"{where} needs 'event: KIND' (events in a window), 'at: TIME' "
                "(the state at a time), 'requests: {model, failed_max}' or "
                "'slo: {model, ttft_p99, attainment}'",
            )
    return tuple(out)


def _window(view: yn.MapView, where: str, known: Known) -> tuple[int, int, str, str]:
    """`within: [FROM, TO]` resolved: start, end, and the two times as written."""
    within = view.require("within")
    bounds = yn.items(within, f"{where}.within")
    if len(bounds) != 2:
        raise yn.Invalid.at(
            within, f"{where}.within must be two times [FROM, TO], got {len(bounds)} item(s)"
        )
    first, start_ms = known.time(bounds[0], f"{where}.within[0]")
    last, end_ms = known.time(bounds[1], f"{where}.within[1]", past_end=True)
    if start_ms > end_ms:
        raise yn.Invalid.at(
            within,
            f"{where}.within: the window ends before it starts ('{first.text}' is "
            f"{fmt_ms(start_ms)}, '{last.text}' is {fmt_ms(end_ms)})",
        )
    return start_ms, end_ms, first.text, last.text


def _requests(view: yn.MapView, where: str, known: Known) -> RequestsExpectation:
    view.check_keys(("requests", "within"))
    body = yn.MapView(view.require("requests"), f"{where}.requests")
    body.check_keys(("model", "failed_max"))
    model_node = body.require("model")
    model = known.model(model_node, f"{where}.requests.model")
    if model not in known.traffic:
        raise yn.Invalid.at(
            model_node,
            f"{where}.requests.model: no traffic is sent to '{model}' (add it under traffic:)",
        )
    failed_max = yn.integer(
        body.require("failed_max"), f"{where}.requests.failed_max", minimum=0, maximum=MAX_REQUESTS
    )
    if view.has("within"):
        start_ms, end_ms, first, last = _window(view, where, known)
        window = f" within [{first}, {last}]"
    else:
        start_ms, end_ms, window = 0, known.duration_ms, ""
    return RequestsExpectation(
        model=model,
        failed_max=failed_max,
        start_ms=start_ms,
        end_ms=end_ms,
        line=yn.line_of(view.node),
        text=f"requests model={model} failed_max={failed_max}{window}",
    )


def _event(view: yn.MapView, where: str, known: Known) -> EventExpectation:
    for entry in view.entries:
        if entry.key in LIST_SUBJECTS:
            raise yn.Invalid.at(
                entry.key_node,
                f"{where}: '{entry.key}' cannot be a filter, its value is a list "
                f"(filters: {', '.join(FILTERS)})",
            )
    view.check_keys(
        (*EVENT_KEYS, *FILTERS),
        f"event, within, never, count, at_most or a filter: {', '.join(FILTERS)}",
    )
    kind = yn.choice(view.require("event"), f"{where}.event", EVENT_KINDS, "event kind")
    start_ms, end_ms, first, last = _window(view, where, known)
    given = [k for k in ("never", "count", "at_most") if view.has(k)]
    if len(given) > 1:
        later = max((view.entry(k).key_node for k in given), key=yn.line_col)
        raise yn.Invalid.at(
            later, f"{where}: '{given[0]}' and '{given[1]}' cannot be used together"
        )
    never = view.has("never") and yn.boolean(view.require("never"), f"{where}.never")
    count: int | None = None
    if view.has("count"):
        count = yn.integer(view.require("count"), f"{where}.count", minimum=0, maximum=MAX_COUNT)
    at_most: int | None = None
    if view.has("at_most"):
        at_most = yn.integer(
            view.require("at_most"), f"{where}.at_most", minimum=0, maximum=MAX_COUNT
        )

    written: list[tuple[str, str | int]] = []
    for entry in view.entries:
        if entry.key in FILTERS:
            value = _filter(entry.key, view.require(entry.key), f"{where}.{entry.key}", known)
            written.append((entry.key, value))
    text = " ".join(
        [
            f"event {kind}",
            *(f"{k}={v}" for k, v in written),
            f"within [{first}, {last}]",
            *(["never"] if never else []),
            *([f"count={count}"] if count is not None else []),
            *([f"at_most={at_most}"] if at_most is not None else []),
        ]
    )
    return EventExpectation(
        kind=kind,
        filters=tuple(sorted(written)),
        start_ms=start_ms,
        end_ms=end_ms,
        never=never,
        count=count,
        at_most=at_most,
        line=yn.line_of(view.node),
        text=text,
    )


def _filter(key: str, node: Node, where: str, known: Known) -> str | int:
    match key:
        case "node":
            return known.node(node, where)
        case "fabric":
            return known.fabric(node, where)
        case "model":
            return known.model(node, where)
        case "fault":
            return known.fault_id(node, where)
        case "controller":
            return known.controller(node, where, leader=False)
        case "rank":
            return yn.integer(node, where, minimum=0, maximum=MAX_SHARDS_PER_REPLICA - 1)
    # Other subjects (reasons, replica ids, counts) compare as written; numbers stay numbers.
    return yn.integer(node, where) if yn.is_int(node) else yn.text(node, where)


def _state(view: yn.MapView, where: str, known: Known) -> StateExpectation:
    view.check_keys(("at", *STATE_KEYS))
    at, at_ms = known.time(view.require("at"), f"{where}.at")
    if not any(view.has(key) for key in STATE_KEYS):
        raise yn.Invalid.at(
            view.node, f"{where} asserts nothing (expected any of: {', '.join(STATE_KEYS)})"
        )
    ready: tuple[tuple[ModelName, int], ...] | None = None
    placed: tuple[tuple[FabricId, int], ...] | None = None
    states: tuple[tuple[NodeId, str], ...] | None = None
    idle: tuple[NodeId, ...] | None = None
    leader: str | None = None
    leaders: int | None = None
    parts: list[str] = []
    for entry in view.entries:
        key = entry.key
        value = view.require(key)
        key_where = f"{where}.{key}"
        match key:
            case "ready_replicas":
                ready = _counts(value, key_where, known.model)
                parts.append(f"{key} {_render(ready)}")
            case "replicas_in":
                placed = _counts(value, key_where, known.fabric)
                parts.append(f"{key} {_render(placed)}")
            case "node_state":
                states = _node_states(value, key_where, known)
                parts.append(f"{key} {_render(states)}")
            case "idle_nodes":
                idle = _node_list(value, key_where, known)
                parts.append(f"{key} [{', '.join(idle)}]")
            case "leader":
                leader = known.controller(value, key_where, leader=False)
                parts.append(f"leader {leader}")
            case "leaders":
                leaders = yn.integer(value, key_where, minimum=0, maximum=known.controllers)
                parts.append(f"leaders {leaders}")
    return StateExpectation(
        at_ms=at_ms,
        ready_replicas=ready,
        idle_nodes=idle,
        node_state=states,
        replicas_in=placed,
        leader=leader,
        leaders=leaders,
        line=yn.line_of(view.node),
        text=f"at {at.text}: {', '.join(parts)}",
    )


def _counts(node: Node, where: str, ref: Callable[[Node, str], _T]) -> tuple[tuple[_T, int], ...]:
    view = yn.MapView(node, where)
    return tuple(
        (
            ref(e.key_node, where),
            yn.integer(e.value, f"{where}.{e.key}", minimum=0, maximum=MAX_REPLICAS),
        )
        for e in view.entries
    )


def _node_states(node: Node, where: str, known: Known) -> tuple[tuple[NodeId, str], ...]:
    view = yn.MapView(node, where)
    return tuple(
        (
            known.node(e.key_node, where),
            yn.choice(e.value, f"{where}.{e.key}", NODE_STATES, "node state"),
        )
        for e in view.entries
    )


def _node_list(node: Node, where: str, known: Known) -> tuple[NodeId, ...]:
    out: dict[NodeId, None] = {}  # file order; a dict finds repeats at once
    for i, item in enumerate(yn.items(node, where)):
        node_id = known.node(item, f"{where}[{i}]")
        if node_id in out:
            raise yn.Invalid.at(item, f"{where}: node '{node_id}' is listed twice")
        out[node_id] = None
    return tuple(out)


def _render(pairs: tuple[tuple[str, object], ...]) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in pairs) + "}"
