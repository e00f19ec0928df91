"""The router's pick from a heap makes exactly the choices of the rule as written: a scan of the
model's routable replicas for the fewest in flight, the least recently picked, the smallest id,
skipping the excluded, the ejected (an ejection that ended puts its replica back on probation)
and those at the outstanding limit. Random joins, leaves, picks, outcomes and times, side by
side with a reference that scans."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw_twin.control.model import ModelName, ReplicaId, TraceEvent
from llmgw_twin.control.routing import Ejection, Router

MODEL = ModelName("m")


@dataclass
class _H:
    outstanding: int = 0
    last_pick: int = -1
    failures: int = 0
    level: int = 0
    ejected_until: int | None = None


@dataclass
class Scan:
    """The rule as written, by a scan per pick."""

    ejection: Ejection
    limit: int | None
    table: set[ReplicaId] = field(default_factory=set)
    health: dict[ReplicaId, _H] = field(default_factory=dict)
    picks: int = 0

    def join(self, rid: ReplicaId) -> None:
        self.table.add(rid)

    def leave(self, rid: ReplicaId) -> None:
        if rid in self.table:
            self.table.discard(rid)
            h = self.health.get(rid)
            if h is not None and h.outstanding == 0:
                del self.health[rid]

    def pick(self, now: int, exclude: set[ReplicaId]) -> ReplicaId | None:
        best = None
        for rid in sorted(self.table):
            if rid in exclude:
                continue
            h = self.health.get(rid)
            if h is None:
                key = (0, -1, rid)
            else:
                if h.ejected_until is not None:
                    if h.ejected_until > now:
                        continue
                    h.ejected_until = None
                    h.failures = self.ejection.failures - 1
                if self.limit is not None and h.outstanding >= self.limit:
                    continue
                key = (h.outstanding, h.last_pick, rid)
            if best is None or key < best:
                best = key
        if best is None:
            return None
        h = self.health.setdefault(best[2], _H())
        h.outstanding += 1
        h.last_pick = self.picks
        self.picks += 1
        return best[2]

    def finished(self, rid: ReplicaId, ok: bool, now: int) -> bool:
        h = self.health.get(rid)
        if h is None or h.outstanding == 0:
            return False
        h.outstanding -= 1
        ejected = False
        if ok:
            h.failures = h.level = 0
        else:
            h.failures += 1
            if h.failures >= self.ejection.failures and h.ejected_until is None:
                h.ejected_until = now + self.ejection.backoff_ms(h.level)
                h.level += 1
                h.failures = 0
                ejected = True
        if rid not in self.table and h.outstanding == 0:
            del self.health[rid]
        return ejected


RIDS = [ReplicaId(f"m-r{i}") for i in range(1, 7)]
ops = st.lists(
    st.one_of(
        st.tuples(st.just("join"), st.sampled_from(RIDS)),
        st.tuples(st.just("leave"), st.sampled_from(RIDS)),
        st.tuples(st.just("pick"), st.sets(st.sampled_from(RIDS), max_size=2)),
        st.tuples(st.just("finish"), st.booleans()),
        st.tuples(st.just("wait"), st.integers(1, 4_000)),
    ),
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(ops, st.sampled_from([None, 1, 2, 3]))
def test_the_heap_picks_what_the_scan_picks(
    script: list[tuple[str, object]], limit: int | None
) -> None:
    ejection = Ejection(failures=2, base_ms=1_000, max_ms=8_000)
    router, scan = Router(ejection, limit), Scan(ejection, limit)
    now, in_flight = 0, []
    for op, arg in script:
        if op == "join":
            assert isinstance(arg, str)
            router.follow(
                TraceEvent.of(now, "replica.ready", model=MODEL, replica=arg, endpoint="e")
            )
            scan.join(ReplicaId(arg))
        elif op == "leave":
            assert isinstance(arg, str)
            router.follow(TraceEvent.of(now, "replica.failed", model=MODEL, replica=arg))
            scan.leave(ReplicaId(arg))
        elif op == "pick":
            assert isinstance(arg, set)
            got = router.pick(MODEL, now, arg)
            want = scan.pick(now, arg)
            assert (got.replica if got else None) == want
            if want is not None:
                in_flight.append(want)
        elif op == "finish" and in_flight:
            rid = in_flight.pop(0)
            assert router.finished(rid, bool(arg), now) == scan.finished(rid, bool(arg), now)
        elif op == "wait":
            assert isinstance(arg, int)
            now += arg
        assert router.ejected(now) == {
            r: h.ejected_until
            for r, h in sorted(scan.health.items())
            if h.ejected_until is not None and h.ejected_until > now and r in scan.table
        }
