"""The scenario loader's `deployments[].autoscale` (a project addition, docs/scenarios.md): the
deployment's replica count follows its load (`control/autoscale.py`).

    deployments:
      - model: chat
        profile: chat
        replicas: 2            # the count at the start
        autoscale: {min: 1, max: 6, signal: outstanding, target: 4,
                    up_window: 30s, down_window: 5m, interval: 10s, scale_to_zero: false}

Invariants:
- `min <= replicas <= max`; `min` 0 only with `scale_to_zero`; a `kv_cache` target is a share
  (0 to 1], the others positive. The largest count (`max`) counts toward the file's limits.
"""

from __future__ import annotations

import re
from fractions import Fraction

from yaml.nodes import Node

from llmgw_twin.control.autoscale import SIGNALS, AutoscalePolicy
from llmgw_twin.control.model import Deployment, ModelName
from llmgw_twin.twin.scenario import yamlnodes as yn
from llmgw_twin.twin.scenario.fleet import ReplicaTotals
from llmgw_twin.twin.scenario.limits import MAX_REPLICAS

AUTOSCALE_KEYS = (
    "min",
    "max",
    "signal",
    "target",
    "up_window",
    "down_window",
    "interval",
    "scale_to_zero",
)
_NUMBER = re.compile(r"\d{1,9}(\.\d{1,6})?")


def load_autoscale(
    node: Node, deployments: tuple[Deployment, ...], totals: ReplicaTotals
) -> tuple[AutoscalePolicy, ...]:
    out: list[AutoscalePolicy] = []
    for i, (item, dep) in enumerate(zip(yn.items(node, "deployments"), deployments, strict=True)):
        got = yn.MapView(item, f"deployments[{i}]").get("autoscale")
        if got is None:
            continue
        out.append(_policy(got, dep, f"deployments[{i}].autoscale", totals))
    return tuple(out)


def _policy(node: Node, dep: Deployment, where: str, totals: ReplicaTotals) -> AutoscalePolicy:
    view = yn.MapView(node, where)
    if dep.roles:  # its load is per decode replica, its count per group: not one measure yet
        raise yn.Invalid.at(node, f"{where}: a deployment of roles is not autoscaled yet")
    view.check_keys(AUTOSCALE_KEYS)
    to_zero_node = view.get("scale_to_zero")
    to_zero = to_zero_node is not None and yn.boolean(to_zero_node, f"{where}.scale_to_zero")
    low_node, high_node = view.require("min"), view.require("max")
    low = yn.integer(low_node, f"{where}.min", minimum=0 if to_zero else 1, maximum=MAX_REPLICAS)
    high = yn.integer(high_node, f"{where}.max", minimum=max(low, 1), maximum=MAX_REPLICAS)
    if not low <= dep.replicas <= high:
        raise yn.Invalid.at(
            node, f"{where}: the deployment's replicas ({dep.replicas}) must be within min and max"
        )
    signal_node = view.require("signal")
    signal = yn.text(signal_node, f"{where}.signal")
    if signal not in SIGNALS:
        raise yn.Invalid.at(
            signal_node, f"{where}.signal: '{yn.short(signal)}' is not one of {', '.join(SIGNALS)}"
        )
    target_node = view.require("target")
    text = yn.text(target_node, f"{where}.target").strip()
    if signal == "ttft_p99":
        try:
            target = Fraction(yn.duration(target_node, f"{where}.target", positive=True))
        except yn.Invalid:
            raise yn.Invalid.at(
                target_node, f"{where}.target: a ttft_p99 target is a duration (500ms)"
            ) from None
    elif _NUMBER.fullmatch(text):
        target = Fraction(text)
    else:
        raise yn.Invalid.at(target_node, f"{where}.target: '{yn.short(text)}' is not a number")
    if target <= 0 or (signal == "kv_cache" and target > 1):
        bound = (
            "above 0 and at most 1 (a share of the cache)" if signal == "kv_cache" else "above 0"
        )
        raise yn.Invalid.at(target_node, f"{where}.target: must be {bound}")
    times = {}
    for key, default in (("up_window", 30_000), ("down_window", 300_000), ("interval", 10_000)):
        got = view.get(key)
        times[key] = default if got is None else yn.duration(got, f"{where}.{key}", positive=True)
    totals.raise_to(dep.model, high, high_node, f"{where}.max")
    return AutoscalePolicy(
        model=ModelName(dep.model),
        minimum=low,
        maximum=high,
        signal=signal,
        target=target,
        up_window_ms=times["up_window"],
        down_window_ms=times["down_window"],
        interval_ms=times["interval"],
        scale_to_zero=to_zero,
    )
