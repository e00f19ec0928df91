"""An engine's performance model: continuous batching over a KV cache, in exact integer time.

`BatchEngine` serves requests as vLLM, SGLang and llama.cpp's server do, reduced to what decides
latency: iterations. Each iteration runs the batch once: the requests admitted at its start do
their prefill (their whole prompt) and produce their first token; every request admitted earlier
produces one more token. An iteration lasts

    a + b * prefill_tokens + c * decode_tokens      (microseconds, rounded up; times `slow`)

with `a`, `b`, `c` an `EnginePerf`'s coefficients (`engines/perf/table.py` holds them as data,
per engine, model and GPU kind). A request admitted holds `prompt + output` tokens of the KV
cache until it finishes (its whole need is reserved at admission, so no request is ever
preempted); the batch holds at most `max_batch` requests. Requests wait in arrival order;
admission stops at the first that does not fit (no overtaking), so a full cache queues them.

Invariants:
- Pure and deterministic: no clock, no randomness, no I/O; time is whole microseconds passed in.
  The same calls give the same answers on every machine.
- An iteration's members are fixed at its start: a request that arrives during an iteration
  joins the next one. `advance(now)` runs every iteration that starts before `now`.
- The cost follows what happens, not the number of iterations: between two admissions or
  finishes the batch is constant, so a stretch of decode iterations is taken in one step.
- A request whose need is larger than the whole cache can never be served: `submit` refuses it.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from fractions import Fraction


@dataclass(frozen=True, slots=True)
class EnginePerf:
    """How fast one engine serves one model on one kind of GPU."""

    name: str
    iteration_us: Fraction
    """a: the fixed cost of one iteration (scheduling, kernel launches, sampling)."""
    prefill_us_per_token: Fraction
    """b: per prompt token prefilled in the iteration."""
    decode_us_per_token: Fraction
    """c: per request decoding one token in the iteration."""
    max_batch: int
    """At most this many requests in the batch at once."""
    kv_tokens: int
    """The KV cache's capacity in tokens."""
    source: str = ""
    """Where the numbers come from (a calibration run, a vendor figure, an assumption)."""

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.kv_tokens < 1:
            raise ValueError(f"{self.name}: max_batch and kv_tokens must be at least 1")
        if min(self.iteration_us, self.prefill_us_per_token, self.decode_us_per_token) < 0:
            raise ValueError(f"{self.name}: coefficients must not be negative")
        if self.iteration_us + self.prefill_us_per_token + self.decode_us_per_token <= 0:
            raise ValueError(f"{self.name}: an iteration must take some time")

    def iteration(
        self, prefill_tokens: int, decode_tokens: int, slow: Fraction = Fraction(1)
    ) -> int:
        """How long one iteration takes, in whole microseconds (at least 1)."""
        exact = (
            self.iteration_us
            + self.prefill_us_per_token * prefill_tokens
            + self.decode_us_per_token * decode_tokens
        ) * slow
        return max(1, -(-exact.numerator // exact.denominator))


@dataclass(frozen=True, slots=True)
class Served:
    """One request the engine finished, its times in microseconds."""

    key: int
    arrived_us: int
    admitted_us: int
    """The start of the iteration that prefilled it."""
    first_token_us: int
    done_us: int
    prompt_tokens: int
    output_tokens: int

    @property
    def queued_us(self) -> int:
        return self.admitted_us - self.arrived_us

    @property
    def ttft_us(self) -> int:
        return self.first_token_us - self.arrived_us

    @property
    def e2e_us(self) -> int:
        return self.done_us - self.arrived_us

    @property
    def tbt_us(self) -> int:
        """The mean time between two of its tokens after the first (0 for a single token)."""
        if self.output_tokens <= 1:
            return 0
        return (self.done_us - self.first_token_us) // (self.output_tokens - 1)


@dataclass(slots=True)
class _Request:
    key: int
    arrived_us: int
    prompt: int
    output: int
    admitted_us: int = 0
    first_token_us: int = 0
    finish_iter: int = 0
    """The index of the iteration at whose end its last token comes."""

    @property
    def need(self) -> int:
        return self.prompt + self.output

    def served(self, done_us: int) -> Served:
        return Served(
            self.key,
            self.arrived_us,
            self.admitted_us,
            self.first_token_us,
            done_us,
            self.prompt,
            self.output,
        )


class BatchEngine:
    """One engine's batch, queue and cache, advanced in exact time by its caller."""

    def __init__(self, perf: EnginePerf, stream: bool = False) -> None:
        """`stream`: keep each request's first token for `first_tokens` (a server that streams);
        without it nothing is kept past a request's end."""
        self.perf = perf
        self._stream = stream
        self.slow = Fraction(1)
        """Every iteration started from now on takes this many times as long (a straggler)."""
        self._queue: deque[_Request] = deque()
        self._running: dict[int, _Request] = {}
        self._finishing: list[tuple[int, int]] = []  # heap of (finish_iter, key); lazy deletion
        self._done: deque[Served] = deque()  # finished, at or before `_free_at_us`
        self._firsts: deque[tuple[int, int]] = deque()  # (first token's time, key), in order
        self._kv_used = 0
        self._iters = 0  # iterations run so far: the next one's index
        self._free_at_us = 0  # the end of the last iteration run
        self._keys: set[int] = set()

    # --- what callers read ---------------------------------------------------------------------

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def kv_used(self) -> int:
        return self._kv_used

    def fits_ever(self, prompt_tokens: int, output_tokens: int) -> bool:
        return prompt_tokens + output_tokens <= self.perf.kv_tokens

    # --- what callers do -----------------------------------------------------------------------

    def submit(self, key: int, now_us: int, prompt_tokens: int, output_tokens: int) -> bool:
        """A request arrives at `now_us`; False (and nothing changes) when it could never fit."""
        if prompt_tokens < 0 or output_tokens < 1:
            raise ValueError("a request needs at least one output token")
        if key in self._keys:
            raise ValueError(f"request {key} is already here")
        if not self.fits_ever(prompt_tokens, output_tokens):
            return False
        self._run_until(now_us)
        if self._idle():
            self._free_at_us = max(self._free_at_us, now_us)
        self._queue.append(_Request(key, now_us, prompt_tokens, output_tokens))
        self._keys.add(key)
        return True

    def cancel(self, key: int, now_us: int) -> None:
        """The request's client went away at `now_us`: it leaves the queue or the batch (from the
        next iteration on) and frees its cache."""
        self._run_until(now_us)
        if key not in self._keys:
            return
        self._keys.discard(key)
        for req in self._queue:
            if req.key == key:
                self._queue.remove(req)
                return
        if key in self._running:
            self._kv_used -= self._running.pop(key).need
            return
        self._done = deque(s for s in self._done if s.key != key)

    def catch_up(self, now_us: int) -> None:
        """Run every iteration that starts before `now_us`; what finished stays to be taken by
        `advance` (the caller's wake for it may still be due at this instant)."""
        self._run_until(now_us)

    def advance(self, now_us: int) -> list[Served]:
        """Run every iteration that starts before `now_us`; the requests finished by `now_us`,
        in the order they finished (ties by admission)."""
        self._run_until(now_us)
        out: list[Served] = []
        while self._done and self._done[0].done_us <= now_us:
            served = self._done.popleft()
            self._keys.discard(served.key)
            out.append(served)
        return out

    def first_tokens(self, now_us: int) -> list[int]:
        """The keys of the requests whose first token came by `now_us` (after the iterations that
        start before it), each once, in order; for a caller that streams."""
        self._run_until(now_us)
        out: list[int] = []
        while self._firsts and self._firsts[0][0] <= now_us:
            _, key = self._firsts.popleft()
            if key in self._keys:
                out.append(key)
        return out

    def next_first_token_us(self) -> int | None:
        """When the next first token comes if no other request arrives or leaves; None when no
        request waits for one, or the queue waits for a request to finish."""
        if self._firsts:
            return self._firsts[0][0]
        admitted, prefill = self._admissible()
        if not admitted:
            return None
        return self._free_at_us + self.perf.iteration(prefill, len(self._running), self.slow)

    def next_done_us(self) -> int | None:
        """When the next request finishes if no other arrives or leaves; None when idle."""
        if self._done:
            return self._done[0].done_us
        if self._idle():
            return None
        admitted, prefill = self._admissible()
        batch = len(self._running)
        start = self._free_at_us
        first_end = start + self.perf.iteration(prefill, batch, self.slow)
        finish = self._top_finish()
        candidates = [] if finish is None else [finish]
        candidates += [self._iters + req.output - 1 for req in admitted]
        soonest = min(candidates)
        if soonest == self._iters:
            return first_end
        step = self.perf.iteration(0, batch + len(admitted), self.slow)
        return first_end + (soonest - self._iters) * step

    # --- the iterations ------------------------------------------------------------------------

    def _idle(self) -> bool:
        return not self._running and not self._queue

    def _top_finish(self) -> int | None:
        while self._finishing and self._finishing[0][1] not in self._running:
            heapq.heappop(self._finishing)  # cancelled
        return self._finishing[0][0] if self._finishing else None

    def _admissible(self) -> tuple[list[_Request], int]:
        """The queue's head that the next iteration admits, and their prompt tokens."""
        out: list[_Request] = []
        room = self.perf.kv_tokens - self._kv_used
        slots = self.perf.max_batch - len(self._running)
        for req in self._queue:
            if len(out) >= slots or req.need > room:
                break
            out.append(req)
            room -= req.need
        return out, sum(r.prompt for r in out)

    def _run_until(self, now_us: int) -> None:
        while not self._idle() and self._free_at_us < now_us:
            start = self._free_at_us
            admitted, prefill = self._admissible()
            if admitted:
                self._prefill(start, admitted, prefill)
                continue
            # a stretch of decode iterations with a constant batch, up to the next finish
            finish = self._top_finish()
            assert finish is not None  # the queue's head always fits an empty cache
            step = self.perf.iteration(0, len(self._running), self.slow)
            starting = -(-(now_us - start) // step)  # iterations that start before now
            count = min(finish - self._iters + 1, starting)
            self._iters += count
            self._free_at_us = start + count * step
            self._finish(self._iters - 1)

    def _prefill(self, start: int, admitted: list[_Request], prefill: int) -> None:
        end = start + self.perf.iteration(prefill, len(self._running), self.slow)
        index = self._iters
        for req in admitted:
            self._queue.popleft()
            self._kv_used += req.need
            req.admitted_us = start
            req.first_token_us = end
            if self._stream:
                self._firsts.append((end, req.key))
            req.finish_iter = index + req.output - 1
            self._running[req.key] = req
            heapq.heappush(self._finishing, (req.finish_iter, req.key))
        self._iters += 1
        self._free_at_us = end
        self._finish(index)

    def _finish(self, index: int) -> None:
        """Retire every request whose last token came at the end of iteration `index`."""
        ended: list[_Request] = []
        while (top := self._top_finish()) is not None and top <= index:
            _, key = heapq.heappop(self._finishing)
            ended.append(self._running.pop(key))
        for req in sorted(ended, key=lambda r: (r.admitted_us, r.arrived_us, r.key)):
            self._kv_used -= req.need
            self._done.append(req.served(self._free_at_us))
