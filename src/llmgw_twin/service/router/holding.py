"""Requests held for a model scaled to zero, while the autoscaler brings a replica up.

Role: a deployment whose autoscale policy allows `scale_to_zero` may have no replica at all. A
request for it is then not refused at once: the forwarding holds it (`Holds.wait`) until a
replica of the model is routable, and says so at once (`on_first`: the router pushes its load,
the controller reports to its autoscaler), so that the autoscaler, which counts the requests
held (`LoadSample.held`), scales the model from zero without waiting for a window
(docs/autoscale.md). The controller tells routers which models are held (`holding` in the
routing feed), from its policies.

Invariants:
- Bounded: at most `per_model` requests held per model (the next is refused 503 at once) and
  each for at most `hold_ms` (then refused 503 with `Retry-After`); a held request checks for
  a replica every `POLL_MS`, so the wait is a bounded loop.
- Only a model with no replica routable at all is held: one whose replicas are ejected or full
  is answered as before.
- `held` counts exactly the requests waiting now: a client that goes away is uncounted at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection

from fastapi.responses import Response

from llmgw_twin.control.model import ModelName
from llmgw_twin.control.routing import Route, Router
from llmgw_twin.service.common.replies import openai_error

HOLD_MS = 120_000
"""How long a request waits for a model scaled to zero: about a cold start of a large model."""
PER_MODEL = 256
"""The most requests held for one model at a time."""
POLL_MS = 100
RETRY_AFTER_S = 5


class Holds:
    def __init__(
        self,
        holdable: Callable[[], Collection[str]] = frozenset,
        *,
        hold_ms: int = HOLD_MS,
        per_model: int = PER_MODEL,
        on_first: Callable[[ModelName], None] | None = None,
    ) -> None:
        self.holdable = holdable
        """The models whose requests are held while none of their replicas is routable."""
        self.hold_ms = hold_ms
        self.per_model = per_model
        self.on_first = on_first
        """Told when a model's first request is held (to report the load at once)."""
        self._held: dict[ModelName, int] = {}
        self.released = 0
        self.expired = 0
        """Requests that got a replica after a hold; requests refused when their hold ran out."""

    def held(self, model: ModelName) -> int:
        return self._held.get(model, 0)

    def counts(self) -> dict[str, int]:
        return {str(m): n for m, n in self._held.items()}

    def view(self) -> dict[str, object]:
        return {"held": self.counts(), "released": self.released, "expired": self.expired}

    def applies(self, model: ModelName) -> bool:
        return model in self.holdable()

    def full(self, model: ModelName) -> bool:
        return self.held(model) >= self.per_model

    async def wait(
        self, router: Router, model: ModelName, clock: Callable[[], int]
    ) -> Route | None:
        """A route to `model` once one is routable (None: the hold ran out)."""
        self._held[model] = self._held.get(model, 0) + 1
        if self._held[model] == 1 and self.on_first is not None:
            self.on_first(model)
        try:
            deadline = clock() + self.hold_ms
            for _ in range(self.hold_ms // POLL_MS + 1):
                await asyncio.sleep(POLL_MS / 1000)
                route = router.pick(model, clock())
                if route is not None:
                    self.released += 1
                    return route
                if clock() >= deadline:
                    break
            self.expired += 1
            return None
        finally:
            left = self._held[model] - 1
            if left:
                self._held[model] = left
            else:
                del self._held[model]

    def refuse(self, model: ModelName, *, full: bool) -> Response:
        """The 503 for a request not held (`full`: the most are held already) or whose hold
        ran out."""
        if full:
            why = f"{self.per_model} requests already wait for it, the most held"
            code = "held_full"
        else:
            why = f"no replica of it served within {self.hold_ms / 1000:g}s"
            code = "not_started"
        return openai_error(
            503,
            f"model {model!r} is scaled to zero and starting; {why}; try again in {RETRY_AFTER_S}s",
            "server_error",
            code,
            headers={"retry-after": str(RETRY_AFTER_S)},
        )
