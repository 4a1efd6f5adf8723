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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from txn_core.clients.subscriptions.store import SubscriptionRef
from txn_core.errors import CorruptDataError, ObjectNotFoundError
from txn_core.format import envelope
from txn_core.format.slotlog import SlotLog
from txn_core.storage.base import Storage
from txn_core.storage.parallel import parallel_map

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


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """A slice's claim: the lease to deliver under (None: not ours now), and when taken, the holder's lease."""

    lease: Lease | None
    holder: Lease | None


class ListedLeaseStore(LeaseStore):
    """Lease slot logs whose old generations are deleted (the slices of a Key_Shared subscription, the hold of
    an Exclusive or Failover one), not cut by the mark-delete position as range leases are. So the newest
    generation is found with one LIST of the prefix (probing from generation 0 would not find the tail; the
    trimmer keeps the listing to about two names per lease), :meth:`delete_stale` deletes all but the newest two
    generations of each, and a claimer re-checks that a generation it created is still the newest (one that
    listed an old tail could otherwise re-create a generation deleted below newer ones). Subclasses lay out the
    keys (:meth:`_slots`) and parse the names (:meth:`_parse`)."""

    def __init__(self, storage: Storage, ref: SubscriptionRef, prefix: str) -> None:
        super().__init__(storage, ref, 1)
        self.prefix = prefix

    def _parse(self, name: str) -> tuple[int, int] | None:
        """``(lease, generation)`` of a name under the prefix, None for a foreign name."""
        raise NotImplementedError

    def latest(self, k: int) -> Lease | None:
        """The newest generation of lease ``k``: one LIST of the prefix, then one read; None if it has none."""
        for _ in range(3):
            gens = self.generations().get(k)
            if not gens:
                return None
            try:
                lease = self._read(k, gens[-1])
            except ObjectNotFoundError:
                continue  # deleted between the LIST and the read (a newer one exists): list again
            self._hint[k] = lease.gen
            return lease
        return None

    def generations(self) -> dict[int, list[int]]:
        """Every lease's generations present, ascending (one LIST)."""
        gens: dict[int, list[int]] = {}
        for name in self.storage.list(self.prefix):
            parsed = self._parse(name)
            if parsed is not None:
                gens.setdefault(parsed[0], []).append(parsed[1])
        return {k: sorted(found) for k, found in gens.items()}

    def claim(self, k: int, owner: str, now_ms: int, ttl_ms: int, *, renew: bool = False) -> Lease | None:
        """One lease's :meth:`claim_many`. Unlike :meth:`LeaseStore.claim`, ``renew`` changes nothing: a lease of
        ``owner``'s is renewed exactly when half of it is spent, never earlier."""
        return self.claim_many([k], owner, now_ms, ttl_ms)[k].lease

    def claim_many(self, ks: Sequence[int], owner: str, now_ms: int, ttl_ms: int) -> dict[int, ClaimResult]:
        """Claim or renew the leases ``ks`` together: every request of a round overlapped, so a consumer taking
        64 slices pays about four round trips, not four per slice. For each: the lease ``owner`` may deliver
        under now (its own valid lease with at least half ``ttl_ms`` left, else a new generation), or None with
        the valid lease of the consumer holding it (None if it lost a race to an unknown winner).

        Rounds: one LIST of the prefix (every lease's generations); the newest generation of each that has one;
        the creates; the winners of lost creates; one LIST that keeps only creates still newest."""
        gens = self.generations()
        current = parallel_map(lambda k: self._newest(k, gens.get(k)), list(ks), leaf=True)
        out: dict[int, ClaimResult] = {}
        wanted: list[tuple[int, Lease]] = []
        for k, lease in zip(ks, current, strict=True):
            if lease is not None and lease.valid(now_ms):
                if lease.owner != owner:
                    out[k] = ClaimResult(None, lease)
                    continue
                if now_ms < lease.acquired_ms + ttl_ms // 2:
                    out[k] = ClaimResult(lease, None)
                    continue
            gen = lease.gen + 1 if lease is not None else (gens[k][-1] + 1 if gens.get(k) else 0)
            wanted.append((k, Lease(k, gen, owner, now_ms, now_ms + ttl_ms)))
        created = parallel_map(self._create, [lease for _k, lease in wanted], leaf=True)
        lost = [item for item, won in zip(wanted, created, strict=True) if not won]
        winners = parallel_map(lambda item: self._winner(item[0], item[1].gen), lost, leaf=True)
        for (k, _lease), winner in zip(lost, winners, strict=True):
            out[k] = ClaimResult(None, winner if winner is not None and winner.valid(now_ms) else None)
        mine = [(k, lease) for (k, lease), won in zip(wanted, created, strict=True) if won]
        if mine:
            newest = self.generations()
            for k, lease in mine:
                still = newest.get(k, [lease.gen])[-1] == lease.gen
                out[k] = ClaimResult(lease if still else None, None)
                if still:
                    self._hint[k] = lease.gen
        return out

    def latest_many(self, ks: Sequence[int]) -> dict[int, Lease | None]:
        """The newest generation of each lease of ``ks``: one LIST, then their reads overlapped."""
        gens = self.generations()
        return dict(zip(ks, parallel_map(lambda k: self._newest(k, gens.get(k)), list(ks), leaf=True), strict=True))

    def _newest(self, k: int, gens: list[int] | None) -> Lease | None:
        """Lease ``k``'s newest generation of ``gens`` (a LIST's), or of a fresh LIST if it vanished meanwhile."""
        if not gens:
            return None
        try:
            return self._read(k, gens[-1])
        except ObjectNotFoundError:
            return self.latest(k)

    def _create(self, lease: Lease) -> bool:
        """Create generation ``lease.gen`` of lease ``lease.range``; False if it exists."""
        return envelope.create_json(self.storage, self._slots(lease.range).key(lease.gen), _KIND, lease.to_json())

    def _winner(self, k: int, gen: int) -> Lease | None:
        try:
            return self._read(k, gen)
        except ObjectNotFoundError:
            return None

    def delete_stale(self) -> int:
        """Delete every generation of each lease but its newest two (one LIST); returns how many. The newest
        two stay so that a claimer that listed just before a renewal still finds the generation it read."""
        deleted = 0
        for k, found in self.generations().items():
            for stale in found[:-2]:
                self.storage.delete(self._slots(k).key(stale))
                deleted += 1
        return deleted

    def delete_below(self, offset: int) -> int:
        """These leases are not cut by offsets: trimming deletes stale generations instead."""
        return self.delete_stale()
