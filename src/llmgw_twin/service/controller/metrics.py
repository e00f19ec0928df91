"""The controller's metrics (docs/metrics.md).

`ControllerMetrics` counts what the controller's trace says as it is published (`record`: events
by kind, placements, failures and reaps by reason) and the heartbeats it hears; everything that
describes the fleet (nodes by health, replicas by state, GPUs) is read from the core at scrape
time by `_ControllerCollector`, as are the counts other parts keep (delivery, the committer, the
lag monitor), and the forwarding's own (`router.request_metrics`).

Invariants:
- A scrape walks the fleet once: each node once (its health, GPUs, failed GPUs) and each
  deployment's live replicas once (their states, the GPUs their shards hold). It runs on the
  event loop, between two core calls, so what it reads is one state of the core. A counter
  moves when its event is published, once its step is durable: a gauge may be a commit ahead.
- A heartbeat costs one integer add here, with no lock; an event a dict update.
- Labels are bounded: node states, replica states, event kinds and reason classes are fixed
  sets, and models are the deployed ones; per-node series are kept to a bounded number of
  nodes (`node_metrics.py`). A failure's or a reap's free-text reason (it names
  nodes, replicas, exit codes) is reduced to its class (`reason_class`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from fastapi.responses import Response
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from llmgw_twin.control.model import (
    CONTROL_EVENT_KINDS,
    NodeState,
    ReplicaState,
    TraceEvent,
)
from llmgw_twin.service.common.metrics import counter, exposition, gauge, routable
from llmgw_twin.service.common.wire import Refused
from llmgw_twin.service.controller.node_metrics import node_series

if TYPE_CHECKING:
    from llmgw_twin.service.controller.app import ControllerRuntime

REASON_CLASSES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern))
    for name, pattern in (
        ("launch_refused", r"^shard \d+ on \S+: refused by the launch policy"),
        ("shard_exited", r"^shard \d+ (exited with code |on \S+: .*\(exit code )"),
        ("shard_vanished", r"^shard \d+ vanished from "),
        ("shard_down", r"^shard \d+ on \S+ went "),
        ("start_timeout", r"^not ready within "),
        ("leader_unresponsive", r"^leader on \S+ not answering for "),
        ("worker_unresponsive", r"^worker rank \d+ on \S+.* not answering for "),
        ("node_lost", r"^node \S+ lost$"),
        ("node_changed", r"^node \S+ registered again: "),
        ("gpu_failed", r"^GPU \d+ failed on "),
        ("adoption_short", r"^short of shard .* after restart$"),
        ("scaled_down", r"^scaled down$"),
        ("moved", r"^moved to "),
        ("drain_ended", r"^drain of \S+ ended$"),
        ("deployment_deleted", r"^deployment deleted$"),
        ("profile_changed", r"^profile changed to \S+"),
        ("group_dissolved", r"^group \S+ dissolved: "),
    )
)
"""The class of a failure's or a reap's reason, by the wording the core gives it (the first
that matches); anything else is `other`."""
LIVE_STATES = tuple(s for s in ReplicaState if s.live)


def reason_class(reason: object) -> str:
    text = str(reason)
    for name, pattern in REASON_CLASSES:
        if pattern.search(text):
            return name
    return "other"


class ControllerMetrics:
    def __init__(self, runtime: ControllerRuntime) -> None:
        self.heartbeats = 0
        """Heartbeats heard (the short way's and FastAPI's), refused ones not counted."""
        self.events: dict[str, int] = dict.fromkeys(CONTROL_EVENT_KINDS, 0)
        self.placements: Counter[str] = Counter()
        self.failures: Counter[tuple[str, str]] = Counter()
        self.reaps: Counter[tuple[str, str]] = Counter()
        self.registry = CollectorRegistry()
        self.registry.register(_ControllerCollector(runtime, self))
        self.registry.register(runtime.forwarder.metrics)

    def record(self, ev: TraceEvent) -> None:
        """Count one event the controller published."""
        kind = ev.kind
        self.events[kind] = self.events.get(kind, 0) + 1
        if kind == "replica.placed":
            self.placements[str(ev.get("model"))] += 1
        elif kind == "replica.failed":
            self.failures[str(ev.get("model")), reason_class(ev.get("reason"))] += 1
        elif kind == "replica.reaped":
            self.reaps[str(ev.get("model")), reason_class(ev.get("reason"))] += 1

    def response(self) -> Response:
        return exposition(self.registry)


class _ControllerCollector:
    def __init__(self, runtime: ControllerRuntime, metrics: ControllerMetrics) -> None:
        self._runtime = runtime
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        yield from self._fleet()
        m = self._metrics
        yield counter(
            "llmgw_events",
            "Trace events the controller emitted, by kind (docs/scenarios.md)",
            ["kind"],
            (((k,), n) for k, n in m.events.items()),
        )
        yield counter(
            "llmgw_replica_placements",
            "Replicas placed (nodes and GPUs booked), by model",
            ["model"],
            (((model,), n) for model, n in m.placements.items()),
        )
        yield counter(
            "llmgw_replica_failures",
            "Replicas failed, by model and the class of the reason",
            ["model", "reason"],
            m.failures.items(),
        )
        yield counter(
            "llmgw_replica_reaps",
            "Replicas reaped (shards dropped, GPUs freed), by model and the class of the reason",
            ["model", "reason"],
            m.reaps.items(),
        )
        yield CounterMetricFamily("llmgw_heartbeats", "Node heartbeats heard", value=m.heartbeats)
        yield from self._runtime.histograms.families()
        yield from self._parts()

    def _parts(self) -> Iterator[Metric]:
        rt = self._runtime
        lag, delivery = rt.lag, rt.delivery
        yield CounterMetricFamily(
            "llmgw_controller_lag_episodes",
            "Times the controller's event loop woke over 1 s late (told to the core)",
            value=lag.episodes,
        )
        yield CounterMetricFamily(
            "llmgw_controller_lag_forgiven_seconds",
            "The controller's own lateness, not counted as node silence, in all",
            value=lag.forgiven_ms / 1000,
        )
        yield GaugeMetricFamily(
            "llmgw_controller_last_lag_seconds",
            "How late the controller's event loop woke the last time it lagged",
            value=lag.last_ms / 1000,
        )
        yield GaugeMetricFamily(
            "llmgw_controller_behind",
            "1 while the controller counts as behind (it lagged in the last 5 s)",
            value=int(lag.behind()),
        )
        yield CounterMetricFamily(
            "llmgw_deliveries_sent", "Commands delivered to agents", value=delivery.sent
        )
        yield CounterMetricFamily(
            "llmgw_deliveries_failed",
            "Sends of commands to agents that failed (each retry counted)",
            value=delivery.failed,
        )
        yield CounterMetricFamily(
            "llmgw_deliveries_given_up",
            "Commands given up on after their last attempt",
            value=delivery.dropped,
        )
        yield GaugeMetricFamily(
            "llmgw_deliveries_queued",
            "Nodes with a command being sent or waiting to be",
            value=delivery.in_flight,
        )
        yield CounterMetricFamily(
            "llmgw_store_commits",
            "Store transactions committed (each holds the writes and events of one or more steps)",
            value=rt.committer.transactions,
        )

    def _fleet(self) -> Iterator[Metric]:
        """The fleet as the core holds it now; nothing while the core is not running."""
        rt = self._runtime
        try:
            core = rt.core
        except Refused:
            return
        nodes: Counter[str] = Counter(dict.fromkeys((s.value for s in NodeState), 0))
        gpus = in_use = failed = 0
        for node in core.nodes():
            info = core.node_info(node)
            assert info is not None
            health = core.node_state(node)
            nodes[health.value if health is not None else "unheard"] += 1
            gpus += info.gpus
            failed += len(core.failed_gpus(node))
        replicas = GaugeMetricFamily(
            "llmgw_replicas", "Live replicas, by model and state", labels=["model", "state"]
        )
        desired = GaugeMetricFamily(
            "llmgw_replicas_desired", "The deployment's desired replicas", labels=["model"]
        )
        unplaceable = GaugeMetricFamily(
            "llmgw_replicas_unplaceable",
            "Pending replicas that fit nowhere now (each said once in replica.unplaceable)",
            labels=["model"],
        )
        models = []
        for dep in core.deployments():
            models.append(dep.model)
            counts = dict.fromkeys(LIVE_STATES, 0)
            stuck = 0
            for rec in core.live_replicas(dep.model):
                counts[rec.state] += 1
                for spec in rec.specs:  # a live replica's shards: its nodes' assignments
                    in_use += len(spec.gpus)
                stuck += rec.state is ReplicaState.PENDING and rec.unplaceable_reason is not None
            for state, n in counts.items():
                replicas.add_metric([dep.model, state.value], n)
            desired.add_metric([dep.model], dep.replicas)
            unplaceable.add_metric([dep.model], stuck)
        rows = (((k,), n) for k, n in sorted(nodes.items()))
        yield gauge("llmgw_nodes", "Registered nodes, by health", ["state"], rows)
        yield GaugeMetricFamily("llmgw_gpus", "GPUs of the registered nodes", value=gpus)
        yield GaugeMetricFamily(
            "llmgw_gpus_in_use", "GPUs held by a shard of a live replica", value=in_use
        )
        yield GaugeMetricFamily(
            "llmgw_gpus_failed", "GPUs reported failed, never placed on until cleared", value=failed
        )
        yield from (replicas, desired, unplaceable)
        yield from node_series(core)
        yield routable(rt.router, models)
        yield GaugeMetricFamily(
            "llmgw_mass_loss_hold",
            "1 while most of the fleet is silent at once and nothing is failed for silence",
            value=int(core.held()),
        )
        yield GaugeMetricFamily(
            "llmgw_quarantines", "Node and profile pairs quarantined", value=len(core.quarantines())
        )
