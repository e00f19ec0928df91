"""Which controller to talk to, when an agent or a router is given every controller's address.

One controller leads at a time (docs/high-availability.md); the others are standbys that do not
answer until they lead. `Controllers` keeps the addresses in the order given and the one that
answered last: a caller sends there, and when that fails (refused, timed out, an error answer)
tries the others in turn, keeping the first that answers. So after a failover an agent finds the
new leader at its next report, not after a timeout per heartbeat.

Invariant: `current` is always one of the addresses given; a success makes its address current.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


class Controllers:
    def __init__(self, urls: Sequence[str]) -> None:
        if not urls:
            raise ValueError("at least one controller address is needed")
        self.urls = tuple(u.rstrip("/") for u in urls)
        self._at = 0

    @property
    def current(self) -> str:
        return self.urls[self._at]

    def in_turn(self) -> list[str]:
        """Every address, the current one first, then the others in the order given."""
        n = len(self.urls)
        return [self.urls[(self._at + i) % n] for i in range(n)]

    def answered(self, url: str) -> None:
        self._at = self.urls.index(url)

    async def first_answer(
        self, call: Callable[[str], Awaitable[T]], failures: tuple[type[BaseException], ...]
    ) -> T:
        """`call(base)` at each address in turn until one answers; the last failure raised
        when none does."""
        last: BaseException | None = None
        for url in self.in_turn():
            try:
                got = await call(url)
            except failures as e:
                last = e
                continue
            self.answered(url)
            return got
        assert last is not None
        raise last
