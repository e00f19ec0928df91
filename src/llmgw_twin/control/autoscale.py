"""The autoscaler: a deployment's replica count follows its load, within bounds, without flapping.

Role: the shell reports each autoscaled model's load now and then (`LoadReport`: the requests
outstanding at its replicas, or the engines' queues, or their KV-cache use, or a TTFT
percentile, with the replicas serving and the requests held for a model at zero). From each
sample the autoscaler works out the replicas the load needs (`need`), keeps the samples of the
longer of its two windows, and recommends a new count: up to the least need of the
`up_window` when even that is above the current count (a burst must last), down by one replica
to the most need of the `down_window` when even that is below it (one replica at a time, and
not again before another `down_window`: the disruption kept small). Requests held for a model
scaled to zero bring it back at once, with no window.

It never fights the fleet's own work: no decision while a replica of the model is being moved
(a drain, a defragmentation or a rollout), and a replica lost to a fault is capacity gone (the
need is per serving replica, so the load of a failed one lands on the rest, and the count it
recommends counts the replacement the controller is already placing).

Invariants:
- The count recommended is within `[minimum, maximum]`, and 0 only with `scale_to_zero`.
- Pure: the same samples and times give the same recommendations.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from llmgw_twin.control.model import ModelName

Signal = Literal["outstanding", "queue", "kv_cache", "ttft_p99"]
SIGNALS: tuple[Signal, ...] = ("outstanding", "queue", "kv_cache", "ttft_p99")
"""What a policy follows: requests outstanding per replica (the router's count), requests
queued per replica (the engines'), KV-cache use per replica (a share, 0 to 1), or the p99 time
to first token (ms) across the model's replicas."""


@dataclass(frozen=True, slots=True)
class AutoscalePolicy:
    model: ModelName
    minimum: int
    maximum: int
    signal: Signal
    target: Fraction
    """Per replica for `outstanding`, `queue` and `kv_cache`; the percentile in ms for
    `ttft_p99`."""
    up_window_ms: int = 30_000
    down_window_ms: int = 300_000
    interval_ms: int = 10_000
    """How often the shell reports the load."""
    scale_to_zero: bool = False

    def __post_init__(self) -> None:
        floor = 0 if self.scale_to_zero else 1
        if not floor <= self.minimum <= self.maximum:
            raise ValueError(
                f"autoscale {self.model}: minimum {self.minimum} and maximum {self.maximum} must "
                f"satisfy {floor} <= minimum <= maximum"
                + ("" if self.scale_to_zero else " (minimum 0 needs scale_to_zero)")
            )
        if self.target <= 0 or (self.signal == "kv_cache" and self.target > 1):
            raise ValueError(f"autoscale {self.model}: target {self.target} out of range")
        if min(self.up_window_ms, self.down_window_ms, self.interval_ms) <= 0:
            raise ValueError(f"autoscale {self.model}: windows and interval must be positive")


@dataclass(frozen=True, slots=True)
class LoadSample:
    model: ModelName
    value: Fraction
    """The signal's reading: the total outstanding or queued requests of the model's serving
    replicas, their mean KV-cache use, or their TTFT p99 in ms."""
    serving: int
    held: int = 0
    """Requests waiting for a model that has no replica serving (scale from zero)."""


def need(policy: AutoscalePolicy, sample: LoadSample) -> int:
    """The replicas the sample's load needs at the policy's target, before bounds."""
    if sample.held > 0 and sample.serving == 0:
        return 1
    if policy.signal in ("outstanding", "queue"):
        whole = sample.value / policy.target
    else:  # a share or a latency per replica: proportional to the replicas serving now
        whole = sample.value * max(sample.serving, 1) / policy.target
    return int(-(-whole // 1))  # ceil


@dataclass(frozen=True, slots=True)
class Decision:
    model: ModelName
    replicas: int
    reason: str


class Autoscaler:
    def __init__(self) -> None:
        self.policies: dict[ModelName, AutoscalePolicy] = {}
        self._needs: dict[ModelName, deque[tuple[int, int]]] = {}
        """model -> (t_ms, need) of the samples of its longer window, oldest first"""
        self._scaled_down_ms: dict[ModelName, int] = {}

    def set_policy(self, policy: AutoscalePolicy) -> None:
        self.policies[policy.model] = policy
        self._needs.setdefault(policy.model, deque())

    def observe(self, sample: LoadSample, now_ms: int) -> None:
        policy = self.policies.get(sample.model)
        if policy is None:
            return
        needs = self._needs[sample.model]
        needs.append((now_ms, need(policy, sample)))
        keep = max(policy.up_window_ms, policy.down_window_ms)
        # the samples of the longer window, and the newest one before it: the windows are
        # "covered" once a sample is at least that old (reports come on no grid in real time)
        while len(needs) >= 2 and needs[1][0] <= now_ms - keep:
            needs.popleft()

    def decide(
        self, model: ModelName, current: int, now_ms: int, held: int, moving: bool
    ) -> Decision | None:
        """A new count for `model`, or None to keep `current`."""
        policy = self.policies.get(model)
        needs = self._needs.get(model)
        if policy is None or not needs:
            return None
        floor, top = policy.minimum, policy.maximum
        if current < floor or current > top:
            return Decision(model, min(max(current, floor), top), "outside its bounds")
        if held > 0 and current == 0:
            return Decision(model, max(1, floor), f"{held} request(s) held at zero replicas")
        if moving:
            return None
        first = needs[0][0]
        # the need over each window: the samples in it, and the one in force at its start
        up = _over(needs, now_ms - policy.up_window_ms)
        if up and first <= now_ms - policy.up_window_ms and min(up) > current:
            to = min(*up, top)
            if to > current:
                return Decision(model, to, f"load needs {min(up)} over {policy.up_window_ms} ms")
        down = _over(needs, now_ms - policy.down_window_ms)
        settled = first <= now_ms - policy.down_window_ms
        last = self._scaled_down_ms.get(model)
        rested = last is None or now_ms - last >= policy.down_window_ms
        if down and settled and rested and max(down) < current:
            to = max(current - 1, *down, floor)
            if to < current:
                self._scaled_down_ms[model] = now_ms
                return Decision(
                    model, to, f"load needs at most {max(down)} over {policy.down_window_ms} ms"
                )
        return None


def _over(needs: deque[tuple[int, int]], since_ms: int) -> list[int]:
    """The needs in force over `[since_ms, now]`: the sample in force at `since_ms` (the last
    at or before it) and each one after."""
    in_force = [n for t, n in needs if t <= since_ms][-1:]
    return in_force + [n for t, n in needs if t > since_ms]
