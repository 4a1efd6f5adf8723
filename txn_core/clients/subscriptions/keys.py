"""Keys of a Key_Shared subscription: their hash, the slices of the hash space, who should hold which slice,
and the slices' leases (PROTOCOL.md "Subscription types", "Key_Shared").

A record's **key hash** is ``crc32(key bytes) % 65536`` (the key bytes of :mod:`txn_core.clients.routing`,
so every language computes it alike; Pulsar hashes into the same 0..65535 space). The space is cut into
:data:`KEY_SLICES` **slices** of :data:`SLICE_SIZE` hashes; slice ``s`` holds hashes
``[s * SLICE_SIZE, (s + 1) * SLICE_SIZE)``. A slice is what a consumer leases: only the holder of a slice's
current lease delivers records whose key hashes into it, so all records of one key go to one consumer at a
time.

Which slices a consumer should hold:

* **auto split** (the default): the counting members, sorted, split the slices evenly in order: member ``i``
  of ``n`` wants ``[i * KEY_SLICES // n, (i + 1) * KEY_SLICES // n)``. A join or a leave moves whole slices;
* **sticky**: the consumer names its hash ranges (``key_ranges``, inclusive, aligned to slices); ranges of two
  live consumers must not overlap.

Slice leases are a slot log per slice, ``keys/<020d slice>-<020d gen>``, of the same immutable objects as
range leases (:mod:`.leases`). Their generations are not bounded by the mark-delete position, so the newest is
found with one LIST of the slice's prefix rather than by probing from generation 0, and :meth:`KeyLeaseStore.
delete_stale` deletes all but the newest two generations of each slice (the trimmer calls it).
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import pyarrow as pa

from txn_core.clients.routing import key_bytes
from txn_core.clients.subscriptions.leases import Lease, LeaseStore
from txn_core.clients.subscriptions.store import SubscriptionRef
from txn_core.errors import ConfigurationError, ObjectNotFoundError
from txn_core.format import envelope
from txn_core.format.slotlog import SlotLog
from txn_core.storage.base import Storage
from txn_core.storage.parallel import parallel_map

_KIND = envelope.ObjectKind.SUBSCRIPTION

#: The key hash space is 0 .. HASH_SPACE - 1, as Pulsar's Key_Shared.
HASH_SPACE = 65536
#: Slices of the hash space leased one by one; at most this many consumers receive keys at once.
KEY_SLICES = 64
#: Hashes per slice; sticky ranges start and end on slice bounds.
SLICE_SIZE = HASH_SPACE // KEY_SLICES


def key_hash(value: object) -> int:
    """The key hash of one key value (see module doc)."""
    return zlib.crc32(key_bytes(value)) % HASH_SPACE


def slices_of(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """The slice of every row's key, as an int32 numpy array (one hash per distinct key value)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    if len(column) == 0:
        return np.zeros(0, dtype=np.int32)
    encoded = column.dictionary_encode(null_encoding="encode")
    uniques = encoded.dictionary.to_pylist()
    table = np.fromiter((key_hash(v) // SLICE_SIZE for v in uniques), dtype=np.int32, count=len(uniques))
    out: np.ndarray = table[encoded.indices.to_numpy(zero_copy_only=False)]
    return out


def auto_split(members: Sequence[str], owner: str) -> frozenset[int]:
    """The slices ``owner`` should hold among the counting ``members`` (auto split; none if not a member)."""
    ordered = sorted(set(members))
    if owner not in ordered:
        return frozenset()
    i, n = ordered.index(owner), len(ordered)
    return frozenset(range(i * KEY_SLICES // n, (i + 1) * KEY_SLICES // n))


def parse_ranges(ranges: Iterable[object]) -> tuple[tuple[int, int], ...]:
    """Sticky ``key_ranges`` checked and sorted: pairs ``(first, last)`` of hashes, inclusive, on slice bounds,
    not overlapping. :class:`ConfigurationError` naming the fix otherwise."""
    out: list[tuple[int, int]] = []
    try:
        pairs: list[tuple[object, ...]] = [tuple(cast("Iterable[object]", r)) for r in ranges]
    except TypeError:
        raise ConfigurationError(
            f"key_ranges must be a list of (first, last) hash pairs, e.g. [(0, 32767)], got {ranges!r}"
        ) from None
    if not pairs:
        raise ConfigurationError("key_ranges is empty: name at least one (first, last) hash range, e.g. [(0, 32767)]")
    for pair in pairs:
        if len(pair) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair):
            raise ConfigurationError(f"a key range is a (first, last) pair of ints, got {pair!r}")
        first, last = cast(int, pair[0]), cast(int, pair[1])
        if not 0 <= first <= last < HASH_SPACE:
            raise ConfigurationError(f"key range {pair!r}: need 0 <= first <= last <= {HASH_SPACE - 1}")
        if first % SLICE_SIZE or (last + 1) % SLICE_SIZE:
            lo, hi = first - first % SLICE_SIZE, last - last % SLICE_SIZE + SLICE_SIZE - 1
            raise ConfigurationError(
                f"key range {pair!r} does not fall on slice bounds: keys are leased in {KEY_SLICES} slices of "
                f"{SLICE_SIZE} hashes, so a range starts at a multiple of {SLICE_SIZE} and ends one before one "
                f"(the nearest covering range is ({lo}, {hi}))"
            )
        out.append((first, last))
    out.sort()
    for (a0, a1), (b0, b1) in itertools.pairwise(out):
        if b0 <= a1:
            raise ConfigurationError(f"key ranges ({a0}, {a1}) and ({b0}, {b1}) overlap")
    return tuple(out)


def slices_in(ranges: Iterable[tuple[int, int]]) -> frozenset[int]:
    """The slices sticky ``ranges`` (checked by :func:`parse_ranges`) cover."""
    return frozenset(s for first, last in ranges for s in range(first // SLICE_SIZE, (last + 1) // SLICE_SIZE))


def ranges_of_slices(slices: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """Slices as inclusive hash ranges, adjacent ones merged (for descriptions)."""
    out: list[list[int]] = []
    for s in sorted(set(slices)):
        if out and out[-1][1] + 1 == s * SLICE_SIZE:
            out[-1][1] = (s + 1) * SLICE_SIZE - 1
        else:
            out.append([s * SLICE_SIZE, (s + 1) * SLICE_SIZE - 1])
    return tuple((a, b) for a, b in out)


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """A slice's claim: the lease to deliver under (None: not ours now), and when taken, the holder's lease."""

    lease: Lease | None
    holder: Lease | None


class KeyLeaseStore(LeaseStore):
    """The slice leases of a Key_Shared subscription, ``keys/<020d slice>-<020d gen>`` (see module doc)."""

    def __init__(self, storage: Storage, ref: SubscriptionRef) -> None:
        super().__init__(storage, ref, 1)
        self.prefix = ref.keys

    def _slots(self, k: int) -> SlotLog:
        return SlotLog(self.storage, f"{self.prefix}{k:020d}-")

    def latest(self, k: int) -> Lease | None:
        """The newest generation of slice ``k``: one LIST of ``keys/`` (old generations are deleted, so probing
        from generation 0 would not find the tail; the trimmer keeps the listing to about two names per slice),
        then one read; None if it has none."""
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
        """Every slice's lease generations present, ascending (one LIST)."""
        gens: dict[int, list[int]] = {}
        for name in self.storage.list(self.prefix):
            k_text, _, gen = name.partition("-")
            if k_text.isdigit() and gen.isdigit():
                gens.setdefault(int(k_text), []).append(int(gen))
        return {k: sorted(found) for k, found in gens.items()}

    def claim(self, k: int, owner: str, now_ms: int, ttl_ms: int, *, renew: bool = False) -> Lease | None:
        """One slice's :meth:`claim_many`. Unlike :meth:`LeaseStore.claim`, ``renew`` changes nothing: a lease of
        ``owner``'s is renewed exactly when half of it is spent, never earlier."""
        return self.claim_many([k], owner, now_ms, ttl_ms)[k].lease

    def claim_many(self, ks: Sequence[int], owner: str, now_ms: int, ttl_ms: int) -> dict[int, ClaimResult]:
        """Claim or renew the slices ``ks`` together: every request of a round overlapped, so a consumer taking
        its 64 slices pays about four round trips, not four per slice. For each slice: the lease ``owner`` may
        deliver under now (its own valid lease with at least half ``ttl_ms`` left, else a new generation), or
        None with the valid lease of the consumer holding it (None if it lost a race to an unknown winner).

        Rounds: one LIST of ``keys/`` (every slice's generations); the newest generation of each slice that has
        one; the creates; the winners of lost creates; one LIST that keeps only creates still newest (see
        :meth:`claim`)."""
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
        """The newest generation of each slice of ``ks``: one LIST, then their reads overlapped."""
        gens = self.generations()
        return dict(zip(ks, parallel_map(lambda k: self._newest(k, gens.get(k)), list(ks), leaf=True), strict=True))

    def _newest(self, k: int, gens: list[int] | None) -> Lease | None:
        """Slice ``k``'s newest generation of ``gens`` (a LIST's), or of a fresh LIST if it vanished meanwhile."""
        if not gens:
            return None
        try:
            return self._read(k, gens[-1])
        except ObjectNotFoundError:
            return self.latest(k)

    def _create(self, lease: Lease) -> bool:
        """Create generation ``lease.gen`` of slice ``lease.range``; False if it exists."""
        return envelope.create_json(self.storage, self._slots(lease.range).key(lease.gen), _KIND, lease.to_json())

    def _winner(self, k: int, gen: int) -> Lease | None:
        try:
            return self._read(k, gen)
        except ObjectNotFoundError:
            return None

    def delete_stale(self) -> int:
        """Delete every generation of each slice but its newest two (one LIST); returns how many. The newest
        two stay so that a claimer that listed just before a renewal still finds the generation it read."""
        deleted = 0
        for k, found in self.generations().items():
            for stale in found[:-2]:
                self.storage.delete(self._slots(k).key(stale))
                deleted += 1
        return deleted

    def delete_below(self, offset: int) -> int:
        """Slice leases are not cut by offsets: trimming deletes stale generations instead."""
        return self.delete_stale()
