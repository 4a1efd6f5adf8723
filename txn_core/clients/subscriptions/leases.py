"""Dispatch leases: which consumer may deliver which records right now (PROTOCOL.md "Subscriptions",
"Dispatch").

The offsets of a topic partition are cut into fixed **ranges** of ``range_size`` offsets (range ``k`` is
``[k * size, (k + 1) * size)``; the size is fixed in the subscription's metadata). Only the holder of a
range's current lease delivers records of that range, so a record is delivered to one consumer at a time.
A range's leases form a slot log ``leases/<020d k>-<020d generation>`` (one flat prefix, so deleted leases
leave nothing behind on any backend); a lease object is immutable JSON::

    {"range": 3, "gen": 7, "owner": "worker-1-3fa2c0e1b7aa", "acquired_ms": ..., "expires_ms": ...,
     "released": false}

* **Claim**: read the newest generation ``g``; if it is valid (not released, ``now < expires_ms``) and held
  by someone else, the range is taken. Otherwise create generation ``g + 1`` with create-if-absent: of
  racing claimers exactly one wins.
* A lease lasts the consumer's ack timeout. When it expires, records delivered under it and not yet
  acknowledged are delivered again by whoever claims the next generation (possibly the same consumer).
* **Renewal**: a holder with nothing unacknowledged in flight in the range may create ``g + 1`` for itself
  after half its lease, so a record is always delivered with at least half an ack timeout ahead of it.
* **Release**: closing a consumer creates a ``released`` generation so others need not wait.

Clock skew between consumers can make a lease look expired early to another consumer, so a record may in
rare cases reach two consumers at once; that costs a redelivery for plain acknowledgements and never
correctness for transactional ones (the conflict rule lets exactly one transaction acknowledge it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from txn_core.clients.subscriptions.store import SubscriptionRef
from txn_core.errors import CorruptDataError, ObjectNotFoundError
from txn_core.format import envelope
from txn_core.format.slotlog import SlotLog
from txn_core.storage.base import Storage

_KIND = envelope.ObjectKind.SUBSCRIPTION


@dataclass(frozen=True, slots=True)
class Lease:
    range: int
    gen: int
    owner: str
    acquired_ms: int
    expires_ms: int
    released: bool = False

    def valid(self, now_ms: int) -> bool:
        return not self.released and now_ms < self.expires_ms

    def to_json(self) -> dict[str, Any]:
        return {
            "range": self.range,
            "gen": self.gen,
            "owner": self.owner,
            "acquired_ms": self.acquired_ms,
            "expires_ms": self.expires_ms,
            "released": self.released,
        }

    @classmethod
    def from_json(cls, v: dict[str, Any], key: str) -> Lease:
        try:
            return cls(
                int(v["range"]),
                int(v["gen"]),
                str(v["owner"]),
                int(v["acquired_ms"]),
                int(v["expires_ms"]),
                bool(v["released"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptDataError(f"{key}: malformed lease: {exc!r}", key) from exc


class LeaseStore:
    """The lease slot logs of one subscription. Thread-safe (no mutable state but a hint cache)."""

    def __init__(self, storage: Storage, ref: SubscriptionRef, range_size: int) -> None:
        self.storage = storage
        self.prefix = ref.leases
        self.range_size = range_size
        self._hint: dict[int, int] = {}  # range -> a generation known to exist

    def _slots(self, k: int) -> SlotLog:
        """The slot log of range ``k``'s lease generations (a subclass may lay them out differently)."""
        return SlotLog(self.storage, f"{self.prefix}{k:020d}-")

    def latest(self, k: int) -> Lease | None:
        """The newest lease generation of range ``k`` (O(log g) existence checks from the hint)."""
        slots = self._slots(k)
        for hint in (self._hint.get(k, 0), 0):
            tail = slots.find_tail(hint, near=True)
            if tail == 0:
                return None
            try:
                lease = self._read(k, tail - 1)
            except ObjectNotFoundError:
                continue  # the range was cleaned up under us: look again from generation 0
            self._hint[k] = lease.gen
            return lease
        return None

    def read(self, k: int, gen: int) -> Lease:
        """Generation ``gen`` of range ``k``'s lease (:class:`ObjectNotFoundError` if absent)."""
        return self._read(k, gen)

    def _read(self, k: int, gen: int) -> Lease:
        key = self._slots(k).key(gen)
        return Lease.from_json(envelope.read_json(self.storage, key, _KIND), key)

    def claim(self, k: int, owner: str, now_ms: int, ttl_ms: int, *, renew: bool = False) -> Lease | None:
        """A valid lease of range ``k`` for ``owner``, or None if someone else holds it (see module doc).

        ``renew``: the owner's valid lease is replaced by a fresh generation.
        """
        current = self.latest(k)
        if current is not None and current.valid(now_ms):
            if current.owner != owner:
                return None
            if not renew:
                return current
        gen = current.gen + 1 if current is not None else 0
        lease = Lease(k, gen, owner, now_ms, now_ms + ttl_ms)
        if envelope.create_json(self.storage, self._slots(k).key(gen), _KIND, lease.to_json()):
            self._hint[k] = gen
            return lease
        try:
            winner = self._read(k, gen)
        except ObjectNotFoundError:
            return None
        self._hint[k] = gen
        return winner if winner.owner == owner and winner.valid(now_ms) else None

    def release(self, lease: Lease, now_ms: int) -> None:
        """Give a range up before its lease expires (a lost race means someone else moved on: fine)."""
        released = Lease(lease.range, lease.gen + 1, lease.owner, now_ms, now_ms, True)
        envelope.create_json(self.storage, self._slots(lease.range).key(lease.gen + 1), _KIND, released.to_json())

    def delete_below(self, offset: int) -> int:
        """Delete the lease objects of every range entirely below ``offset`` (one LIST); returns how many."""
        deleted = 0
        for name in self.storage.list(self.prefix):
            k_text, _, gen = name.partition("-")
            if not (k_text.isdigit() and gen.isdigit()):
                continue
            k = int(k_text)
            if (k + 1) * self.range_size > offset:
                break  # names sort by range
            self.storage.delete(self.prefix + name)
            self._hint.pop(k, None)
            deleted += 1
        return deleted
