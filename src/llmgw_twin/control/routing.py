"""Which ready replica serves a request: the routing core, shared by every router.

The router keeps its own table of routable replicas per model, fed by the controller's event
stream alone, the way a router process beside the controller follows it (the kinds and the
snapshot: `routing_feed.py`): an event of `JOINS` with a leader `endpoint` adds the replica
(`replica.ready`, `replica.adopted` of a serving replica, `replica.recovered`,
`replica.routable`); one of `LEAVES` removes it (`replica.failed`,
`replica.reaped`, `replica.degraded`, `replica.unroutable`), and so does a join that carries no
endpoint or says `ready: false` (a replica adopted while not serving, one recovered while a node
of it is suspect): the controller has just said it is not routable. The controller emits those
in the very step in which a replica stops being routable (a node of it suspect or lost, a shard
lost, its leader unhealthy, the replica reaped), so a router that applies a step's events
applies the change in that step.

A router that lost the stream and finds a new controller process (`resync`) takes that
controller's snapshot: ready replicas join, replicas gone from it leave, and a replica the new
controller has restored but not yet judged (`adopting`) keeps the entry the router had: it was
serving when the old controller last spoke, and the new one will say `adopted` or `failed`. A
node of such a replica going silent takes it out all the same, whatever its state: the
controller says `replica.unroutable` for an adopting replica as for a ready one, and leaves it
out of its snapshot while a node of it is silent.

Picking (`pick`): among the model's routable replicas that are neither ejected nor at the
outstanding limit, the one with the fewest requests in flight; ties go to the replica picked
least recently (one never picked first, then the smallest id), so a run is deterministic and
sequential traffic still takes turns. A pick costs O(log n) in the model's replicas: each model
keeps its candidates in a heap by that key, every change of a key pushes it anew, and an entry
is checked when it comes out (a scan of every replica per pick made the twin's once-a-second
probe most of a long run's cost). Passive ejection works without the controller: a
replica whose requests fail `Ejection.failures` times in a row leaves the pick for a back-off
that doubles at each ejection in a row (up to `max_ms`); back from one, its first failure ejects
it again; a success clears its record. The caller tells the outcome of every pick (`finished`).

A role group's model (`control/groups.py`) is picked in two: its decode replicas are the model's
own table, each group's prefill replicas a table of their own; a pick takes the decode replica
as above among those whose group has a prefill replica to take the request, and that group's
prefill replica by the same key (`Route.prefill`), each counted and told `finished` on its own.

Pure: times are integer milliseconds handed in by the shell.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from llmgw_twin.control.model import ModelName, ReplicaId, TraceEvent
from llmgw_twin.control.routing_feed import FEED_KINDS, JOINS, SnapshotEntry, SnapshotState
from llmgw_twin.control.routing_values import Ejection, NoRoute, Route, RouterTimeouts

__all__ = ["Ejection", "Key", "NoRoute", "Route", "Router", "RouterTimeouts"]


@dataclass(slots=True)
class _Health:
    """What the router knows of one replica's requests."""

    outstanding: int = 0
    last_pick: int = -1  # the router's pick number of its latest pick
    failures: int = 0  # consecutive
    level: int = 0  # ejections in a row
    ejected_until: int | None = None


Key = tuple[int, int, ReplicaId]
"""A replica's place in the pick: (requests in flight, last pick, id), smallest first."""


@dataclass(slots=True)
class _Model:
    endpoints: dict[ReplicaId, str] = field(default_factory=dict)
    order: list[ReplicaId] = field(default_factory=list)  # sorted ids
    heap: list[Key] = field(default_factory=list)
    """The pick's candidates by key. An entry is checked when it comes out: one whose replica
    left, is ejected or at the limit, or whose key changed since (a newer entry was pushed) is
    dropped, so every change pushes and nothing is searched."""
    ejected: list[tuple[int, ReplicaId]] = field(default_factory=list)
    """(ejected until, replica), soonest first: back into the pick when the time comes."""


class Router:
    def __init__(self, ejection: Ejection | None = None, outstanding_limit: int | None = None):
        if outstanding_limit is not None and outstanding_limit < 1:
            raise ValueError("outstanding_limit must be at least 1")
        self.ejection = ejection or Ejection()
        self.outstanding_limit = outstanding_limit
        self._models: dict[ModelName, _Model] = {}
        """Per table: a model's own (a role group's decode replicas), or a group's prefill
        replicas under `_prefill_key`."""
        self._model_of: dict[ReplicaId, ModelName] = {}
        """Each routed replica's table."""
        self._group_of: dict[ReplicaId, tuple[ModelName, str]] = {}
        """Each routed member of a role group: its model and group."""
        self._grouped: dict[ModelName, int] = {}
        """Models whose routes are role groups (picked as prefill then decode), with how many
        members are routed: a model deployed anew without roles routes plainly again."""
        self._health: dict[ReplicaId, _Health] = {}
        self._picks = 0
        self.ejections = 0
        """Ejections so far (every model)."""

    # --- the table, from the controller --------------------------------------------------------

    def follow(self, event: TraceEvent) -> None:
        """Apply one controller event."""
        if event.kind not in FEED_KINDS:
            return
        model, replica = event.get("model"), event.get("replica")
        endpoint = event.get("endpoint")
        if not isinstance(model, str) or not isinstance(replica, str):
            return
        rid = ReplicaId(replica)
        if event.kind in JOINS and isinstance(endpoint, str) and event.get("ready") is not False:
            group, role = event.get("group"), event.get("role")
            if isinstance(group, str) and isinstance(role, str) and group:
                member = (ModelName(model), group)
                self._join(_table_key(ModelName(model), group, role), rid, endpoint, member)
            else:
                self._join(ModelName(model), rid, endpoint)
        else:  # a leave, or a join that says it is not routable (adopted not ready, say)
            self._leave(rid)

    def resync(self, snapshot: Iterable[SnapshotEntry]) -> None:
        """Take a (new) controller's snapshot: ready replicas join, adopting ones keep the entry
        this router had, and every other replica leaves."""
        keep: dict[ReplicaId, tuple[ModelName, str, tuple[ModelName, str] | None]] = {}
        for entry in snapshot:
            if entry.state is SnapshotState.READY and entry.endpoint is not None:
                key = _table_key(entry.model, entry.group, entry.role)
                member = (entry.model, entry.group) if entry.group else None
                keep[entry.replica] = (key, entry.endpoint, member)
            elif entry.state is SnapshotState.ADOPTING:
                had = self._model_of.get(entry.replica)
                if had is not None:
                    endpoint = self._models[had].endpoints[entry.replica]
                    keep[entry.replica] = (had, endpoint, self._group_of.get(entry.replica))
        for rid in [r for r in self._model_of if r not in keep or keep[r][0] != self._model_of[r]]:
            self._leave(rid)
        for rid, (model, endpoint, member) in sorted(keep.items()):
            self._join(model, rid, endpoint, member)

    def _join(
        self,
        model: ModelName,
        rid: ReplicaId,
        endpoint: str,
        member: tuple[ModelName, str] | None = None,
    ) -> None:
        """`rid` joins table `model`; `member`: the role group's model and group it is of."""
        if member is not None and rid not in self._group_of:
            self._group_of[rid] = member
            self._grouped[member[0]] = self._grouped.get(member[0], 0) + 1
        table = self._models.setdefault(model, _Model())
        if rid not in table.endpoints:
            bisect.insort(table.order, rid)
        table.endpoints[rid] = endpoint
        self._model_of[rid] = model
        health = self._health.get(rid)
        if health is not None and health.ejected_until is not None:
            heapq.heappush(table.ejected, (health.ejected_until, rid))
        else:
            self._push(table, rid)

    def _key(self, rid: ReplicaId) -> Key:
        health = self._health.get(rid)
        return (0, -1, rid) if health is None else (health.outstanding, health.last_pick, rid)

    def _push(self, table: _Model, rid: ReplicaId) -> None:
        heapq.heappush(table.heap, self._key(rid))
        if len(table.heap) > 2 * len(table.order) + 64:  # mostly stale: keep it O(replicas)
            table.heap = [self._key(r) for r in table.order]
            heapq.heapify(table.heap)

    def _leave(self, rid: ReplicaId) -> None:
        model = self._model_of.pop(rid, None)
        if model is None:
            return
        member = self._group_of.pop(rid, None)
        if member is not None:
            left = self._grouped[member[0]] - 1
            if left:
                self._grouped[member[0]] = left
            else:
                del self._grouped[member[0]]
        table = self._models[model]
        del table.endpoints[rid]
        del table.order[bisect.bisect_left(table.order, rid)]
        health = self._health.get(rid)
        if health is not None and health.outstanding == 0:
            del self._health[rid]  # nothing left to account for: ids are never reused

    # --- reading it ----------------------------------------------------------------------------

    def models(self) -> list[ModelName]:
        return sorted(m for m, t in self._models.items() if t.order and _PREFILL not in m)

    def size(self, model: ModelName) -> int:
        """How many replicas `routes(model)` holds."""
        table = self._models.get(model)
        return 0 if table is None else len(table.order)

    def grouped(self, model: ModelName) -> bool:
        """Whether `model` is routed as role groups (a decode replica with a prefill one)."""
        return model in self._grouped

    def routed(self) -> frozenset[ReplicaId]:
        """Every replica in the table, of every model and role (ejected ones too)."""
        return frozenset(self._model_of)

    def routes(self, model: ModelName) -> list[Route]:
        """The model's routable replicas as the controller announced them (ejected ones too)."""
        table = self._models.get(model)
        if table is None:
            return []
        return [Route(r, table.endpoints[r]) for r in table.order]

    def ejected(self, now_ms: int) -> dict[ReplicaId, int]:
        """Each replica in the table that is ejected at `now_ms`, and until when."""
        return {
            rid: h.ejected_until
            for rid, h in sorted(self._health.items())
            if h.ejected_until is not None and h.ejected_until > now_ms and rid in self._model_of
        }

    def outstanding(self, rid: ReplicaId) -> int:
        health = self._health.get(rid)
        return 0 if health is None else health.outstanding

    # --- picking -------------------------------------------------------------------------------

    def pick(
        self, model: ModelName, now_ms: int = 0, exclude: Iterable[ReplicaId] = ()
    ) -> Route | None:
        """The replica for the next request to `model`, counted as in flight until `finished`;
        None when none may take it (`why_none` says why). For a role group's model: its decode
        replica, with `prefill` a prefill replica of the same group (one whose group has no
        prefill replica to take it is passed over); both are counted. `exclude` may name
        replicas of either role (a retry avoids the prefill replica that failed it too)."""
        table = self._models.get(model)
        if table is None or not table.order:
            return None
        skip = set(exclude)
        partner = None
        found: dict[ReplicaId, tuple[_Model, Key]] = {}  # each decode's prefill, as judged
        if model in self._grouped:

            def partner(rid: ReplicaId) -> bool:
                hit = self._prefill_of(model, rid, now_ms, skip)
                if hit is not None:
                    found[rid] = hit
                return hit is not None

        key = self._top(table, now_ms, skip, partner, taken=True)
        if key is None:
            return None
        route = self._take(table, key[2])
        if partner is not None:
            prefill_table, prefill_key = found[route.replica]
            prefill = self._take(prefill_table, prefill_key[2])
            route = Route(route.replica, route.endpoint, prefill)
        return route

    def _prefill_of(
        self, model: ModelName, rid: ReplicaId, now_ms: int, skip: set[ReplicaId]
    ) -> tuple[_Model, Key] | None:
        """The prefill table of `rid`'s group and the key it would pick, if any."""
        table = self._models.get(_prefill_key(model, self._group(rid)))
        if table is None or not table.order:
            return None
        key = self._top(table, now_ms, skip, None)
        return None if key is None else (table, key)

    def _top(
        self,
        table: _Model,
        now_ms: int,
        skip: set[ReplicaId],
        partner: Callable[[ReplicaId], bool] | None,
        taken: bool = False,
    ) -> Key | None:
        """The key `pick` would take from `table`: the smallest whose replica is routable,
        neither ejected nor at the limit nor skipped, and (with `partner`) has a partner. Stale
        entries are dropped on the way; skipped ones stay, and so does the one found unless it
        is `taken` now (`_take` pushes its new key: this one would only be found stale)."""
        self._back_from_ejection(table, now_ms)
        limit = self.outstanding_limit
        passed: list[Key] = []  # excluded by the caller: back in the heap after
        chosen: Key | None = None
        while table.heap:
            key = heapq.heappop(table.heap)
            rid = key[2]
            if rid not in table.endpoints or key != self._key(rid):
                continue  # left, or a newer entry holds its key
            health = self._health.get(rid)
            if health is not None and health.ejected_until is not None:
                continue  # in the ejected heap until its time comes
            if limit is not None and key[0] >= limit:
                continue  # pushed again when a request of it finishes
            passed.append(key)
            if rid in skip or (partner is not None and not partner(rid)):
                continue
            chosen = key
            if taken:
                passed.pop()
            break
        for key in passed:
            heapq.heappush(table.heap, key)
        return chosen

    def _take(self, table: _Model, rid: ReplicaId) -> Route:
        """Count a pick of `rid` from `table`: in flight, and picked now."""
        health = self._health.setdefault(rid, _Health())
        health.outstanding += 1
        health.last_pick = self._picks
        self._picks += 1
        self._push(table, rid)
        return Route(rid, table.endpoints[rid])

    def _back_from_ejection(self, table: _Model, now_ms: int) -> None:
        """Every replica of the table whose ejection ended by `now_ms` is back, on probation:
        its next failure ejects it again."""
        while table.ejected and table.ejected[0][0] <= now_ms:
            until, rid = heapq.heappop(table.ejected)
            health = self._health.get(rid)
            if health is None or health.ejected_until != until or rid not in table.endpoints:
                continue
            health.ejected_until = None
            health.failures = self.ejection.failures - 1
            self._push(table, rid)

    def why_none(
        self, model: ModelName, now_ms: int = 0, exclude: Iterable[ReplicaId] = ()
    ) -> NoRoute:
        """Why `pick` found nothing for `model` at `now_ms`."""
        skip = set(exclude)
        candidates = [r.replica for r in self.routes(model) if r.replica not in skip]
        ejected = self.ejected(now_ms)
        grouped = model in self._grouped
        if grouped:  # a decode replica whose group has no prefill one left
            candidates = [r for r in candidates if self._prefills(model, r)]
        if not candidates:
            return NoRoute.NO_REPLICA
        if all(
            r in ejected or (grouped and all(p in ejected for p in self._prefills(model, r)))
            for r in candidates
        ):
            return NoRoute.EJECTED
        return NoRoute.BUSY

    def _group(self, rid: ReplicaId) -> str:
        member = self._group_of.get(rid)
        return member[1] if member is not None else ""

    def _prefills(self, model: ModelName, rid: ReplicaId) -> list[ReplicaId]:
        """The prefill replicas routed for `rid`'s group."""
        table = self._models.get(_prefill_key(model, self._group(rid)))
        return [] if table is None else list(table.order)

    def finished(self, rid: ReplicaId, ok: bool, now_ms: int = 0) -> bool:
        """A picked request to `rid` ended: `ok` when the replica answered (whatever the
        answer's status but a failure of the replica's own), not when it failed to connect,
        timed out, cut its answer or answered with a server error. True when this ejected it."""
        health = self._health.get(rid)
        if health is None or health.outstanding == 0:
            return False  # not a pick of this router's (or already told)
        health.outstanding -= 1
        ejected = False
        if ok:
            health.failures = 0
            health.level = 0
        else:
            health.failures += 1
            if health.failures >= self.ejection.failures and health.ejected_until is None:
                health.ejected_until = now_ms + self.ejection.backoff_ms(health.level)
                health.level += 1
                health.failures = 0
                self.ejections += 1
                ejected = True
        model = self._model_of.get(rid)
        if model is None:
            if health.outstanding == 0:
                del self._health[rid]
        elif ejected:
            assert health.ejected_until is not None
            heapq.heappush(self._models[model].ejected, (health.ejected_until, rid))
        elif health.ejected_until is None:
            self._push(self._models[model], rid)
        return ejected


def _table_key(model: ModelName, group: str, role: str) -> ModelName:
    """The table a replica is routed from: its model's, or its group's prefill table."""
    if group and role == "prefill":
        return _prefill_key(model, group)
    return model


_PREFILL = "/prefill@"


def _prefill_key(model: ModelName, group: str) -> ModelName:
    """A group's prefill table (model names hold neither '/' nor '@': no model's own)."""
    return ModelName(f"{model}{_PREFILL}{group}")
