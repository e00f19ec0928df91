"""Moves: the one make-before-break service, used by the defragmenter, the drainer and the
rollout of a changed profile.

A move replaces a running replica (the original) with a new one of the same model (the copy).
The copy does not count toward its deployment while the original lives; once it is ready and
routable (no node of it suspect, every one heard alive), the original is retired in the same
step (`Lifecycle.take_over`), so the deployment never has fewer ready replicas than before.

`Moves` keeps every move in flight, each under the part that started it (`DEFRAG`: the
defragmenter's, `DRAIN`: the drainer's, `ROLLOUT`: the rollout's), and the room a defragmentation
holds for the pending replica it makes room for. The lifecycle tells it of replicas that become
ready or go (the `ready` and `gone` hooks); it answers with the moves that complete and the moves
that break, and the lifecycle carries them out. The users start moves here and read what is in
flight; they are told of nothing directly, and what a user must learn later (that a plan broke,
that a replica became ready) waits here until that user asks (`take_broken`, `take_readied`).

Invariants: a replica is the copy of at most one move; a defragmentation's held room is freed the
moment its last move completes or any of its moves breaks; a user's moves are handled in the
order of their copies' ids (the defragmenter's, then the drainer's, then the rollout's), as are a
replica's breaks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from llmgw_twin.control.model import NodeId, ProfileName, ReplicaId
from llmgw_twin.control.placement import CapacityIndex
from llmgw_twin.control.replicas import ReplicaRecord

MoveUser = Literal["defrag", "drain", "rollout"]
DEFRAG: MoveUser = "defrag"
DRAIN: MoveUser = "drain"
ROLLOUT: MoveUser = "rollout"
USERS: tuple[MoveUser, ...] = (DEFRAG, DRAIN, ROLLOUT)


@dataclass(frozen=True, slots=True)
class Move:
    user: MoveUser
    original: ReplicaId
    copy: ReplicaId
    drain: NodeId | None = None
    """The node a drain move empties; None for the others'."""
    profile: ProfileName | None = None
    """The profile a rollout move's copy runs; None for the others'."""

    @property
    def why(self) -> str:
        """What the move's end says: a drain's `drain of NODE`, a rollout's `profile changed to
        P`; nothing for a defragmentation."""
        if self.drain is not None:
            return f"drain of {self.drain}"
        return f"profile changed to {self.profile}" if self.profile is not None else ""


@dataclass(frozen=True, slots=True)
class Broken:
    """A move that ends without completing: `replica.move_aborted` with `reason`, and the copy
    reaped if `reap_copy` (its original was scaled down)."""

    move: Move
    model: str
    reason: str
    reap_copy: bool = False


class Moves:
    """Every move in flight, and the room held for a defragmentation's target."""

    def __init__(self, capacity: CapacityIndex, node_ok: Callable[[NodeId], bool]) -> None:
        self._capacity = capacity
        self._node_ok = node_ok
        self._copies: dict[MoveUser, dict[ReplicaId, Move]] = {u: {} for u in USERS}
        self._originals: dict[MoveUser, dict[ReplicaId, Move]] = {u: {} for u in USERS}
        self._held: dict[NodeId, tuple[int, ...]] = {}
        """GPUs free when a defragmentation began that its target is to take: held meanwhile."""
        self._target: ReplicaId | None = None
        self._broken = False
        self._readied = False

    # --- what the users read -----------------------------------------------------------------

    def in_flight(self, user: MoveUser) -> list[Move]:
        """The user's moves not yet done, by copy id."""
        mine = self._copies[user]
        return [mine[c] for c in sorted(mine)]

    def busy(self, user: MoveUser) -> bool:
        return bool(self._copies[user])

    def copy_of(self, original: ReplicaId, user: MoveUser) -> ReplicaId | None:
        move = self._originals[user].get(original)
        return move.copy if move is not None else None

    def is_original(self, rid: ReplicaId, user: MoveUser) -> bool:
        return rid in self._originals[user]

    def moving(self, rid: ReplicaId) -> bool:
        """`rid` is the copy or the original of a move of any user."""
        return any(rid in self._copies[u] or rid in self._originals[u] for u in USERS)

    @property
    def held(self) -> dict[NodeId, tuple[int, ...]]:
        """GPUs held for the target of the defragmentation under way, per node."""
        return dict(self._held)

    def take_broken(self) -> bool:
        """A defragmentation move broke since the last call (its plan is void)."""
        broken, self._broken = self._broken, False
        return broken

    def take_readied(self) -> bool:
        """A replica became ready since the last call (one more that could be moved)."""
        readied, self._readied = self._readied, False
        return readied

    # --- what the users do -------------------------------------------------------------------

    def start(self, move: Move) -> None:
        self._copies[move.user][move.copy] = move
        self._originals[move.user][move.original] = move

    def forget(self, move: Move) -> None:
        """The move is over: neither completed nor broken (a drain that ended)."""
        del self._copies[move.user][move.copy]
        del self._originals[move.user][move.original]

    def hold(self, node: NodeId, gpus: tuple[int, ...]) -> None:
        """Book `gpus` of `node` for the target while the defragmentation under way runs."""
        self._held[node] = gpus
        self._capacity.book(node, gpus)

    def refit(self, node: NodeId, gpus: int, fabric_changed: bool) -> bool:
        """`node` registered again with other facts: room held on it that is no longer there (a
        GPU past its new count, or the node in another fabric) voids the defragmentation's
        plan, as a broken move does; whether room was freed. Called before the node is
        re-indexed, while the capacity still books what is held."""
        held = self._held.get(node)
        if held is None or not (fabric_changed or any(g >= gpus for g in held)):
            return False
        self._broken = True
        return self._release()

    def making_room_for(self, rid: ReplicaId) -> bool:
        """Moves under way make room for this pending replica (its room is held meanwhile)."""
        return rid == self._target

    def aim(self, target: ReplicaId) -> None:
        """The defragmentation under way makes room for `target`."""
        self._target = target

    def completes(self, copy: ReplicaRecord, user: MoveUser) -> Move | None:
        """The user's move whose copy this is, if it may complete now (the copy routable); it
        is then no longer in flight, and the caller retires the original (`Lifecycle.take_over`)
        and then says so (`ended`)."""
        move = self._copies[user].get(copy.id)
        if move is None or copy.unroutable or not all(self._node_ok(n) for n in copy.nodes):
            return None
        self.forget(move)
        return move

    def ended(self, move: Move) -> bool:
        """A completed move's original is retired: the last of a defragmentation's frees its
        held room. Returns whether room was freed."""
        if move.user is DEFRAG and not self._copies[DEFRAG]:
            return self._release()
        return False

    # --- the lifecycle's hooks ---------------------------------------------------------------

    def is_copy(self, rid: ReplicaId) -> bool:
        """A move's copy: it does not count toward its deployment while its original lives."""
        return any(rid in self._copies[u] for u in USERS)

    def ready(self, rec: ReplicaRecord) -> list[Move]:
        """`rec` became ready: the moves it completes now (at most one)."""
        self._readied = True
        done = (self.completes(rec, u) for u in USERS)
        return [m for m in done if m is not None]

    def gone(self, rec: ReplicaRecord, scaled_down: bool) -> tuple[list[Broken], bool]:
        """`rec` was reaped: the moves that break (in order), and whether held room was freed.
        A copy gone first leaves its original; an original gone first leaves its copy as its
        replacement, unless it was scaled down, which takes the copy with it."""
        broken: list[Broken] = []
        freed = False
        for user in USERS:
            move = self._copies[user].get(rec.id)
            if move is not None:  # the copy never became ready: the original stays
                self.forget(move)
                freed |= self._break(user)
                why = "failed before the move was done"
                if user is DRAIN:
                    why = "gone before the drain move was done"
                broken.append(Broken(move, rec.model, f"{rec.id} {why}"))
                continue
            move = self._originals[user].get(rec.id)
            if move is None:
                continue
            self.forget(move)
            freed |= self._break(user)
            if scaled_down:
                broken.append(Broken(move, rec.model, f"{rec.id} scaled down", reap_copy=True))
            elif user is not DRAIN:  # a drain's copy takes its original's place without a word
                reason = f"{rec.id} failed; {move.copy} replaces it"
                broken.append(Broken(move, rec.model, reason))
        return broken, freed

    def _break(self, user: MoveUser) -> bool:
        """A defragmentation's move broke: its plan is void, its held room free again."""
        if user is not DEFRAG:
            return False
        self._broken = True
        return self._release()

    def _release(self) -> bool:
        for node, gpus in self._held.items():
            self._capacity.release(node, gpus)
        freed = bool(self._held)
        self._held = {}
        self._target = None
        return freed
