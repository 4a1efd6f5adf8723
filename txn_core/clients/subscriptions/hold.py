"""The hold: which one consumer may deliver the records of an Exclusive or Failover subscription now
(PROTOCOL.md "Subscription types", "Exclusive", "Failover").

The hold is a lease like a dispatch range's (:mod:`.leases`), in its own slot log ``hold/<020d gen>`` of
immutable objects ``{"range": 0, "gen", "owner", "acquired_ms", "expires_ms", "released"}``; ``owner`` is
the consumer id (its name and a random suffix). Invariants:

* at most one consumer holds a valid generation at any time (by the clock of whoever looks): a generation
  is created with create-if-absent only after reading the previous one lapsed, released or the creator's
  own, so of racing consumers exactly one wins;
* a consumer delivers records only after :meth:`Hold.keep` confirmed a generation of its own with at least
  half its ``ttl_ms`` left (renewing it first when half is spent), so records go out under a hold that
  lasts at least ``ttl_ms / 2`` longer.

Generations older than the newest two are deleted by trimming (:meth:`ListedLeaseStore.delete_stale`), so
an idle holder's renewals do not pile up; the newest is found by listing ``hold/``, and a generation a
consumer created counts only while it is the newest.

Crash windows: a consumer that dies holding it leaves a generation that lapses ``ttl_ms`` after it was
created; the next consumer takes it then. One that dies while creating a generation left it complete or
absent (create-if-absent), and either is a valid state. Releasing (closing) writes a ``released``
generation, so the next consumer need not wait; if that write loses a race, someone else moved on: fine.
"""

from __future__ import annotations

from datetime import UTC, datetime

from txn_core.clients.subscriptions.errors import ConsumerBusyError
from txn_core.clients.subscriptions.leases import Lease, ListedLeaseStore
from txn_core.clients.subscriptions.store import SubscriptionRef
from txn_core.format.slotlog import SlotLog
from txn_core.storage.base import Storage

#: The hold is one lease; its objects record it as range 0.
HOLD_RANGE = 0


class HoldStore(ListedLeaseStore):
    """The hold's slot log ``hold/<020d gen>`` (one lease, so no range in the key). Its old generations are
    deleted by trimming (one is written per half session timeout while a consumer holds it), so it is a
    listed lease: the newest generation is found with one LIST."""

    def __init__(self, storage: Storage, ref: SubscriptionRef) -> None:
        super().__init__(storage, ref, ref.hold)

    def _slots(self, k: int) -> SlotLog:
        return SlotLog(self.storage, self.prefix)

    def _parse(self, name: str) -> tuple[int, int] | None:
        return (HOLD_RANGE, int(name)) if name.isdigit() else None


class Hold:
    """One consumer's claim on an Exclusive or Failover subscription (see module doc). Not thread-safe: the
    consumer locks."""

    def __init__(self, storage: Storage, ref: SubscriptionRef, owner: str, ttl_ms: int) -> None:
        self.ref = ref
        self.store = HoldStore(storage, ref)
        self.owner = owner
        self.ttl_ms = ttl_ms
        self.lease: Lease | None = None

    def holder(self, now_ms: int) -> Lease | None:
        """The valid hold generation, whoever's, or None when nobody holds the subscription."""
        lease = self.store.latest(HOLD_RANGE)
        return lease if lease is not None and lease.valid(now_ms) else None

    def keep(self, now_ms: int) -> Lease:
        """This consumer's hold with at least half its time left: taken if nobody holds it, renewed when half
        spent. :class:`ConsumerBusyError` (naming the holder and when its hold lapses) if another consumer
        holds it."""
        lease = self.lease
        if lease is not None and lease.valid(now_ms) and now_ms < lease.acquired_ms + self.ttl_ms // 2:
            return lease
        taken = self.store.claim(HOLD_RANGE, self.owner, now_ms, self.ttl_ms, renew=True)
        if taken is None:
            self.lease = None
            raise self._busy(now_ms, lost=lease is not None)
        self.lease = taken
        return taken

    def _busy(self, now_ms: int, *, lost: bool) -> ConsumerBusyError:
        holder = self.holder(now_ms)
        name = holder.owner if holder is not None else "(another consumer, just now)"
        until = holder.expires_ms if holder is not None else now_ms
        what = (
            f"consumer {self.owner!r} no longer holds exclusive {self.ref}: its hold lapsed and consumer {name!r} "
            if lost
            else f"exclusive {self.ref} is held by consumer {name!r}, "
        )
        return ConsumerBusyError(
            f"{what}holds it until {_utc(until)} ({max(0, until - now_ms)} ms from now, unless it renews it). Close "
            "that consumer, or wait for its hold to lapse (it is renewed by its receive calls), or use another "
            "subscription name (a Shared or Failover subscription takes several consumers)",
            holder=name,
            expires_ms=until,
        )

    def release(self, now_ms: int) -> None:
        """Give the hold up (closing), so the next consumer need not wait for it to lapse."""
        lease, self.lease = self.lease, None
        if lease is not None and lease.valid(now_ms):
            self.store.release(lease, now_ms)


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
