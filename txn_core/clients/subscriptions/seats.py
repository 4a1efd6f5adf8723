"""Which consumers of a subscription deliver, by its type (PROTOCOL.md "Subscription types").

A consumer asks its seat before every delivery (:meth:`Seat.may_deliver`); dispatch itself (range leases,
the replayed state) is the same for every type, so the rules of "Dispatch" and the conflict rule hold
whatever the seat says — a seat only narrows who claims ranges:

* :class:`Seat` (Shared): every consumer delivers;
* :class:`ExclusiveSeat`: only the consumer holding the hold (:mod:`.hold`); the others are refused with
  :class:`ConsumerBusyError`;
* :class:`KeySharedSeat`: every member delivers, the keys of the slices it wants (:mod:`.keys`): an even
  split over the members, or its sticky ranges (refused with :class:`ConsumerBusyError` if they overlap
  another member's);
* :class:`FailoverSeat`: only the active member (:mod:`.members`), once it holds the hold; the others wait.
  A member that is no longer the active one releases the hold at once, and each range it leases as soon as
  nothing of it is in flight, so the records it is still processing go to no one else meanwhile. A standby
  member looks at the hold every :data:`HOLD_CHECK_MS` and lists the members again when it is free, so a
  closing active member is replaced at once rather than at the next periodic listing.
"""

from __future__ import annotations

from txn_core.clients.subscriptions.dispatcher import Dispatcher
from txn_core.clients.subscriptions.errors import ConsumerBusyError
from txn_core.clients.subscriptions.hold import Hold, HoldStore
from txn_core.clients.subscriptions.keys import auto_split, slices_in
from txn_core.clients.subscriptions.members import Membership
from txn_core.clients.subscriptions.store import SubscriptionMeta, SubscriptionType

#: How often (log clock) a standby Failover member looks whether the hold is free.
HOLD_CHECK_MS = 200


class Seat:
    """A consumer of a Shared subscription: it always delivers."""

    #: the hold's generations, which trimming thins out (Exclusive, Failover)
    holds: HoldStore | None = None

    def join(self, now_ms: int) -> None:
        """Take a place when the consumer opens (may refuse: :class:`ConsumerBusyError`)."""

    def may_deliver(self, now_ms: int) -> bool:
        """Whether the consumer may deliver now (called before each receive's dispatch)."""
        return True

    def leave(self, now_ms: int) -> None:
        """Give the place up when the consumer closes (after its ranges were released)."""


class ExclusiveSeat(Seat):
    """The one consumer of an Exclusive subscription (see module doc)."""

    def __init__(self, hold: Hold, dispatch: Dispatcher) -> None:
        self.hold = hold
        self.dispatch = dispatch
        self.holds = hold.store

    def join(self, now_ms: int) -> None:
        self.hold.keep(now_ms)

    def may_deliver(self, now_ms: int) -> bool:
        """True once the hold is confirmed; a consumer that lost it gives its range leases up (the holder
        delivers their records at once) and raises :class:`ConsumerBusyError` naming the holder. What it has in
        flight it may still acknowledge (a transactional acknowledgement that the holder also made loses by the
        conflict rule)."""
        try:
            self.hold.keep(now_ms)
        except ConsumerBusyError:
            self.dispatch.release_all(now_ms)
            raise
        return True

    def leave(self, now_ms: int) -> None:
        self.hold.release(now_ms)


class FailoverSeat(Seat):
    """A member of a Failover subscription (see module doc)."""

    def __init__(self, hold: Hold, members: Membership, partition: int, dispatch: Dispatcher) -> None:
        self.hold = hold
        self.holds = hold.store
        self.members = members
        self.partition = partition
        self.dispatch = dispatch
        self._hold_checked_ms = -HOLD_CHECK_MS

    def join(self, now_ms: int) -> None:
        self.members.keep(now_ms)
        self.members.members(now_ms, fresh=True)

    def may_deliver(self, now_ms: int) -> bool:
        self.members.keep(now_ms)
        active = self.members.active(now_ms, self.partition)
        if active != self.hold.owner and now_ms - self._hold_checked_ms >= HOLD_CHECK_MS:
            # A standby looks at the hold now and then: free means the active member closed (or died), and the
            # listing it left behind is stale; list again rather than wait for the next periodic listing.
            self._hold_checked_ms = now_ms
            if self.hold.holder(now_ms) is None:
                active = self.members.active(now_ms, self.partition, fresh=True)
        if active == self.hold.owner:
            try:
                self.hold.keep(now_ms)
            except ConsumerBusyError:
                return False  # the previous active member has not let go yet: it will, or its hold lapses
            return True
        self.dispatch.release_idle(now_ms)
        self.hold.release(now_ms)
        return False

    def leave(self, now_ms: int) -> None:
        self.hold.release(now_ms)
        self.members.leave()


class KeySharedSeat(Seat):
    """A member of a Key_Shared subscription (see module doc): ``ranges`` are its sticky key ranges (checked,
    see :func:`.keys.parse_ranges`), None to split the keys with the other members."""

    def __init__(self, members: Membership, ranges: tuple[tuple[int, int], ...] | None) -> None:
        self.members = members
        self.ranges = ranges
        self._sticky = None if ranges is None else slices_in(ranges)

    def join(self, now_ms: int) -> None:
        self.members.keep(now_ms)
        self.members.members(now_ms, fresh=True)
        if self.ranges is None:
            return
        conflicts: list[tuple[str, list[tuple[int, ...]], int]] = []  # (consumer, its overlapping ranges, expiry)
        for other, value in self.members.objects_of_others(now_ms).items():
            theirs = [tuple(r) for r in value.get("key_ranges") or ()]
            overlap = [r for r in theirs if any(r[0] <= mine[1] and mine[0] <= r[1] for mine in self.ranges)]
            if overlap:
                conflicts.append((other, overlap, int(value.get("expires_ms", now_ms))))
        if conflicts:
            self.members.leave()
            held = "; ".join(f"{overlap} held by consumer {other!r}" for other, overlap, _ in conflicts)
            raise ConsumerBusyError(
                f"sticky key ranges {list(self.ranges)} overlap {held}, of the same Key_Shared subscription (sticky "
                "consumers divide the hash space 0..65535 between them). Name ranges no live consumer holds, or "
                "close those consumers first",
                holder=conflicts[0][0],
                expires_ms=conflicts[0][2],
            )

    def may_deliver(self, now_ms: int) -> bool:
        self.members.keep(now_ms)
        return True

    def wanted(self, now_ms: int) -> frozenset[int]:
        """The key slices this member should hold now."""
        if self._sticky is not None:
            return self._sticky
        return auto_split(self.members.members(now_ms), self.members.owner)

    def leave(self, now_ms: int) -> None:
        self.members.leave()


def seat_for(meta: SubscriptionMeta, owner: str, session_timeout_ms: int, dispatch: Dispatcher) -> Seat:
    """The seat of consumer ``owner`` in a subscription of ``meta``'s type (not joined yet)."""
    storage = dispatch.ctx.storage
    if meta.type is SubscriptionType.SHARED:
        return Seat()
    hold = Hold(storage, meta.ref, owner, session_timeout_ms)
    if meta.type is SubscriptionType.EXCLUSIVE:
        return ExclusiveSeat(hold, dispatch)
    members = Membership(storage, meta.ref, owner, session_timeout_ms)
    return FailoverSeat(hold, members, meta.ref.partition, dispatch)
