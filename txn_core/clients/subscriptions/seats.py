"""Which consumers of a subscription deliver, by its type (PROTOCOL.md "Subscription types").

A consumer asks its seat before every delivery (:meth:`Seat.may_deliver`); dispatch itself (range leases,
the replayed state) is the same for every type, so the rules of "Dispatch" and the conflict rule hold
whatever the seat says — a seat only narrows who claims ranges:

* :class:`Seat` (Shared): every consumer delivers;
* :class:`ExclusiveSeat`: only the consumer holding the hold (:mod:`.hold`); the others are refused with
  :class:`ConsumerBusyError`;
* :class:`FailoverSeat`: only the active member (:mod:`.members`), once it holds the hold; the others wait.
  A member that is no longer the active one releases the hold at once, and each range it leases as soon as
  nothing of it is in flight, so the records it is still processing go to no one else meanwhile. A standby
  member looks at the hold every :data:`HOLD_CHECK_MS` and lists the members again when it is free, so a
  closing active member is replaced at once rather than at the next periodic listing.
"""

from __future__ import annotations

from txn_core.clients.subscriptions.dispatcher import Dispatcher
from txn_core.clients.subscriptions.errors import ConsumerBusyError
from txn_core.clients.subscriptions.hold import Hold
from txn_core.clients.subscriptions.members import Membership
from txn_core.clients.subscriptions.store import SubscriptionMeta, SubscriptionType

#: How often (log clock) a standby Failover member looks whether the hold is free.
HOLD_CHECK_MS = 200


class Seat:
    """A consumer of a Shared subscription: it always delivers."""

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
