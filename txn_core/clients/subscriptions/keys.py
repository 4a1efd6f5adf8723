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
range leases (:mod:`.leases`). Their generations are not bounded by the mark-delete position, so they are
:class:`~.leases.ListedLeaseStore` leases: found with one LIST of ``keys/``, trimmed to the newest two
generations of each slice, claimed many at once.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Iterable, Sequence
from typing import cast

import numpy as np
import pyarrow as pa

from txn_core.clients.routing import key_bytes, per_key
from txn_core.clients.subscriptions.leases import ListedLeaseStore
from txn_core.clients.subscriptions.store import SubscriptionRef
from txn_core.errors import ConfigurationError
from txn_core.format.slotlog import SlotLog
from txn_core.storage.base import Storage

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
    return per_key(column, lambda value: key_hash(value) // SLICE_SIZE)


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


class KeyLeaseStore(ListedLeaseStore):
    """The slice leases of a Key_Shared subscription, ``keys/<020d slice>-<020d gen>`` (see module doc)."""

    def __init__(self, storage: Storage, ref: SubscriptionRef) -> None:
        super().__init__(storage, ref, ref.keys)

    def _slots(self, k: int) -> SlotLog:
        return SlotLog(self.storage, f"{self.prefix}{k:020d}-")

    def _parse(self, name: str) -> tuple[int, int] | None:
        k_text, _, gen = name.partition("-")
        return (int(k_text), int(gen)) if k_text.isdigit() and gen.isdigit() else None
