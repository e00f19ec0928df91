"""The router's side of the routing feed: the controller's feed, followed into the core Router.

Role: `FeedFollower` long-polls `GET {controller}/v1/router/feed` (`feed.py`, docs/router.md)
in a background task and applies each page to the router service's `control.routing.Router`: a
snapshot (`Router.resync`), then the events (`Router.follow`), in order. It also keeps the
deployed models of the latest page, which the router's `/v1/models` and its 404s read.

Invariants:
- The table changes only by a page, and a page is checked whole (`FeedPageW`) before any of it
  is applied: a malformed answer changes nothing.
- While the controller cannot be reached (stopped, restarting, the network cut) the table stays
  as it was last told, and the router keeps serving from it. Attempts go on, 0.1 s apart at
  first, doubling up to `reconnect_max_ms`, each resuming from the last `next` and `epoch`: a
  restarted controller (another epoch) answers with a snapshot, and its own numbering follows.
- The token is read from its file at start and again after each 401, so a rotated token is
  picked up without a restart; it is never logged.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Sequence
from contextlib import suppress
from pathlib import Path

import httpx
from pydantic import ValidationError

from llmgw_twin.control.routing import Router
from llmgw_twin.service.common.feed import FeedPageW, event_of, snapshot_entry
from llmgw_twin.service.common.leaders import Controllers
from llmgw_twin.service.common.tls import ClientTls, client_verify

log = logging.getLogger("llmgw_twin.router")

FIRST_RECONNECT_MS = 100
CONNECT_TIMEOUT_S = 2.0
READ_MARGIN_S = 10.0
"""How much longer than the wait asked for a read of the feed may take before it is given up."""


LOAD_PUSH_S = 5.0
"""How often a router pushes its load to the controller's autoscaler."""


class _Unavailable(Exception):
    pass


class FeedFollower:
    def __init__(
        self,
        router: Router,
        controller_url: str,
        *,
        token_file: Path | None = None,
        tls: ClientTls | None = None,
        wait_ms: int = 20_000,
        reconnect_max_ms: int = 5_000,
        transport: httpx.AsyncBaseTransport | None = None,
        others: Sequence[str] = (),
        push_load_s: float = LOAD_PUSH_S,
    ) -> None:
        """`others`: the other controllers' addresses, when several share a store: the feed
        is read from whichever leads (a standby does not answer). `push_load_s`: how often
        the requests outstanding per model are pushed to it, for its autoscaler (0: never)."""
        self.router = router
        self.push_load_s = push_load_s
        self.router_id = f"router-{uuid.uuid4().hex[:12]}"
        self.pushes = 0
        self._push_task: asyncio.Task[None] | None = None
        self.controllers = Controllers(list(dict.fromkeys((controller_url, *others))))
        self._token_file = token_file
        self._tls = tls
        self.wait_ms = wait_ms
        self.reconnect_max_ms = max(reconnect_max_ms, FIRST_RECONNECT_MS)
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._task: asyncio.Task[None] | None = None
        self._token: str | None = None
        self.models: list[str] | None = None
        """The deployed models as the latest page said; None until a first page."""
        self.holding: frozenset[str] = frozenset()
        """The models whose requests are held at zero replicas, as the latest page said."""
        self._push_soon = asyncio.Event()
        self.held: Callable[[], dict[str, int]] = dict
        """The requests this router holds now, per model (its forwarding's `Holds.counts`)."""
        self.epoch: str | None = None
        self.next = 0
        self.connected = False
        self.pages = 0
        self.resyncs = 0
        self.events = 0
        self.disconnects = 0

    def start(self) -> None:
        self._token = self._read_token()
        self._client = httpx.AsyncClient(
            transport=self._transport,
            trust_env=False,
            verify=client_verify(self._tls),
            timeout=httpx.Timeout(
                connect=CONNECT_TIMEOUT_S,
                read=self.wait_ms / 1000 + READ_MARGIN_S,
                write=CONNECT_TIMEOUT_S,
                pool=CONNECT_TIMEOUT_S,
            ),
        )
        self._task = asyncio.get_running_loop().create_task(self._run())
        if self.push_load_s > 0:
            self._push_task = asyncio.get_running_loop().create_task(self._push_loads())

    def outstanding(self) -> dict[str, int]:
        """Requests outstanding at each model's routable replicas, by this router."""
        return {
            str(m): sum(self.router.outstanding(r.replica) for r in self.router.routes(m))
            for m in self.router.models()
        }

    def push_now(self, _model: object = None) -> None:
        """Push the load now, not at the next interval: a request is held for a model at zero
        replicas, and the autoscaler should hear of it at once."""
        if self.push_load_s > 0:
            self._push_soon.set()

    async def _push_loads(self) -> None:
        """Every `push_load_s`, this router's load to the controller that answered last (its
        autoscaler sums every router's, docs/autoscale.md); a push that fails is dropped: the
        next one says the same, newer."""
        while True:
            with suppress(TimeoutError):
                await asyncio.wait_for(self._push_soon.wait(), self.push_load_s)
            self._push_soon.clear()
            assert self._client is not None
            headers = {"authorization": f"Bearer {self._token}"} if self._token else {}
            body: dict[str, object] = {"router": self.router_id, "outstanding": self.outstanding()}
            held = self.held()
            if held:
                body["held"] = held
            try:
                r = await self._client.post(
                    self.controllers.current + "/v1/router/load", json=body, headers=headers
                )
            except httpx.HTTPError:
                continue
            if r.status_code == 200:
                self.pushes += 1

    async def stop(self) -> None:
        if self._push_task is not None:
            self._push_task.cancel()
            await asyncio.gather(self._push_task, return_exceptions=True)
            self._push_task = None
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    @property
    def url(self) -> str:
        return self.controllers.current + "/v1/router/feed"

    def _read_token(self) -> str | None:
        if self._token_file is None:
            return None
        try:
            return self._token_file.read_text(encoding="utf-8").strip() or None
        except OSError as e:
            log.error("cannot read the controller token file %s: %s", self._token_file, e)
            return None

    async def _run(self) -> None:
        delay_ms = FIRST_RECONNECT_MS
        while True:
            try:
                page = await self._poll()
            except _Unavailable as e:
                if self.connected or (self.pages == 0 and delay_ms == FIRST_RECONNECT_MS):
                    log.warning("the controller's feed at %s is unavailable: %s", self.url, e)
                if self.connected:
                    self.disconnects += 1
                self.connected = False
                await asyncio.sleep(delay_ms / 1000)
                delay_ms = min(2 * delay_ms, self.reconnect_max_ms)
                continue
            if not self.connected and self.pages:
                log.info("the controller's feed is back (epoch %s)", page.epoch)
            delay_ms = FIRST_RECONNECT_MS
            self.apply(page)

    async def _poll(self) -> FeedPageW:
        """A page from the controller that answered last, else from another in turn."""
        return await self.controllers.first_answer(self._poll_at, (_Unavailable,))

    async def _poll_at(self, base: str) -> FeedPageW:
        assert self._client is not None
        url = base + "/v1/router/feed"
        params: dict[str, str | int] = {"after": self.next, "wait_ms": self.wait_ms}
        if self.epoch is not None:
            params["epoch"] = self.epoch
        headers = {"authorization": f"Bearer {self._token}"} if self._token else {}
        try:
            r = await self._client.get(url, params=params, headers=headers)
        except httpx.HTTPError as e:
            raise _Unavailable(f"{type(e).__name__}: {e}") from None
        if r.status_code == 401:
            self._token = self._read_token()  # rotated, perhaps: read it again for the next try
        if r.status_code != 200:
            raise _Unavailable(f"HTTP {r.status_code}: {r.text[:300]}")
        try:
            page = FeedPageW.model_validate_json(r.content)
        except ValidationError as e:
            raise _Unavailable(f"not a feed page: {e.errors()[:1]}") from None
        if page.epoch != self.epoch and page.snapshot is None:
            self.epoch = None  # another controller, and no snapshot: ask again from scratch
            raise _Unavailable("a page of another epoch without a snapshot")
        return page

    def apply(self, page: FeedPageW) -> None:
        """One page: its snapshot, then its events, then where to go on from."""
        if page.snapshot is not None:
            self.router.resync(snapshot_entry(e) for e in page.snapshot)
            self.resyncs += 1
            if page.epoch != self.epoch:
                log.info(
                    "following controller epoch %s: %d replicas in its snapshot",
                    page.epoch,
                    len(page.snapshot),
                )
        for w in page.events:
            self.router.follow(event_of(w))
        self.events += len(page.events)
        self.epoch, self.next, self.models = page.epoch, page.next, list(page.models)
        self.holding = frozenset(page.holding)
        self.connected = True
        self.pages += 1

    def view(self) -> dict[str, object]:
        return {
            "controller": self.url.removesuffix("/v1/router/feed"),
            "connected": self.connected,
            "epoch": self.epoch,
            "next": self.next,
            "pages": self.pages,
            "resyncs": self.resyncs,
            "events": self.events,
            "disconnects": self.disconnects,
            "load_pushes": self.pushes,
        }
