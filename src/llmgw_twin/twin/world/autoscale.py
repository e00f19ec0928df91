"""The load the twin's controller autoscales on (`deployments[].autoscale`).

Role: every policy's `interval`, read each autoscaled model's load where a production shell
reads it, and report it to the leading controller (`LoadReport`): the requests outstanding at
its routable replicas (the router's count), the requests queued in their batches and the share
of their KV caches in use (the engine model, `world/serving.py`), the p99 time to first token of
the requests that arrived in the last interval, and the requests held for a model at zero
replicas. A model without traffic reads as no load.

Invariants:
- Nothing here draws randomness or changes what it reads: a scenario without `autoscale`
  schedules nothing, and its trace is what it was.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

from llmgw_twin.control.autoscale import AutoscalePolicy, LoadSample
from llmgw_twin.control.protocol import LoadReport
from llmgw_twin.twin.scenario.model import Scenario
from llmgw_twin.twin.world.latency import percentile
from llmgw_twin.twin.world.sim import World
from llmgw_twin.twin.world.traffic import TrafficRouter


class LoadReporter:
    def __init__(
        self,
        scenario: Scenario,
        world: World,
        traffic: Callable[[], TrafficRouter | None],
        report: Callable[[LoadReport], None],
    ) -> None:
        self.world = world
        self.policies = scenario.autoscale
        self._traffic = traffic
        self._report = report
        self._profiles = {d.model: d.profile for d in scenario.deployments}
        if self.policies:
            self.interval_ms = min(p.interval_ms for p in self.policies)
            world.later(self.interval_ms, self._tick)

    def _tick(self) -> None:
        self._report(LoadReport(tuple(self.sample(p) for p in self.policies)))
        self.world.later(self.interval_ms, self._tick)

    def sample(self, policy: AutoscalePolicy) -> LoadSample:
        traffic = self._traffic()
        model = policy.model
        if traffic is None:
            return LoadSample(model, Fraction(0), 0)
        routes = traffic.router.routes(model)
        held = traffic.held(model)
        serving = len(routes)
        value = Fraction(0)
        if policy.signal == "outstanding":
            value = Fraction(sum(traffic.router.outstanding(r.replica) for r in routes))
        elif policy.signal in ("queue", "kv_cache") and traffic.serving is not None:
            loads = [traffic.serving.load(r.replica) for r in routes]
            if policy.signal == "queue":
                value = Fraction(sum(q for q, _, _ in loads))
            else:
                perf = traffic.serving.perf.get(self._profiles[model])
                if perf is not None and loads:
                    used = sum(kv for _, _, kv in loads)
                    value = Fraction(used, perf.kv_tokens * len(loads))
        elif policy.signal == "ttft_p99" and traffic.latencies is not None:
            now = self.world.now
            recent = traffic.latencies.of(model, now - policy.interval_ms, now)
            if recent:
                value = Fraction(percentile([s.ttft_us for s in recent], 99), 1000)
        return LoadSample(model, value, serving, held)
