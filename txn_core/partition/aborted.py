"""The aborted-transaction index and the skip ranges of a partition (PROTOCOL.md "Transaction buffer").

:class:`AbortedIndex` maps an aborted transaction to ``(first offset, last offset, abort-marker offset)``
in this partition. A read_committed reader drops every data entry of an aborted transaction, wherever it
sits (a zombie write landing after the marker included). Rows are kept as sorted numpy arrays plus a
small dict of recent additions, so loading a million rows from a snapshot is an array read and a sort,
and a lookup is a dict probe or a binary search: O(log n), no Python object per row.

:class:`SkipRanges` holds offset ranges of entries that must never be delivered although their
transaction is not aborted: duplicates (a producer sequence already seen) and zombie writes after a
transaction's commit marker.

Transaction keys pack a :class:`TxnId` into 64 bits: ``index << 60 | coordinator << 44 | sequence`` (the
index of a transaction in its begin record is below 16; for the first, 0, the key is ``coordinator << 44 |
sequence`` as before indexes existed, so keys in older snapshots stay valid).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from txn_core.errors import TxnLogError
from txn_core.format.arrays import from_numpy, to_numpy
from txn_core.format.ids import TxnId

SEQ_BITS = 44
MAX_SEQ = (1 << SEQ_BITS) - 1
INDEX_SHIFT = 60
MAX_COORDINATOR = (1 << (INDEX_SHIFT - SEQ_BITS)) - 1
MAX_INDEX = (1 << (64 - INDEX_SHIFT)) - 1
#: Recent rows are merged into the sorted arrays once there are this many.
MERGE_AT = 4096

ABORTED_SCHEMA = pa.schema(
    [
        ("txn", pa.uint64()),
        ("first", pa.int64()),
        ("last", pa.int64()),
        ("marker", pa.int64()),
    ]
)


def txn_key(txn: TxnId) -> int:
    if txn.sequence > MAX_SEQ or txn.coordinator > MAX_COORDINATOR or txn.index > MAX_INDEX:
        raise TxnLogError(f"transaction id {txn} is outside the packable range")
    return (txn.index << INDEX_SHIFT) | (txn.coordinator << SEQ_BITS) | txn.sequence


def txn_keys(hi: np.ndarray, lo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`txn_key` of the ids whose header halves are ``hi`` and ``lo`` (:meth:`TxnId.from_header`), all
    at once, and which of them are inside the packable range (the others' keys are meaningless:
    :func:`txn_key` raises for them)."""
    hi = hi.astype(np.uint64)
    lo = lo.astype(np.uint64)
    coordinator, index = hi & np.uint64(0xFFFFFFFF), hi >> np.uint64(32)
    valid = (lo <= np.uint64(MAX_SEQ)) & (coordinator <= np.uint64(MAX_COORDINATOR)) & (index <= np.uint64(MAX_INDEX))
    keys: np.ndarray = (index << np.uint64(INDEX_SHIFT)) | (coordinator << np.uint64(SEQ_BITS)) | lo
    return keys, valid


def key_txn(key: int) -> TxnId:
    return TxnId((key >> SEQ_BITS) & MAX_COORDINATOR, key & MAX_SEQ, key >> INDEX_SHIFT)


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    txn: TxnId
    first_offset: int
    last_offset: int
    marker_offset: int


class AbortedIndex:
    """Aborted transactions of one partition. Not thread-safe (owned by one buffer)."""

    __slots__ = ("_first", "_keys", "_last", "_marker", "_recent")

    def __init__(self) -> None:
        self._keys = np.empty(0, dtype=np.uint64)  # sorted
        self._first = np.empty(0, dtype=np.int64)
        self._last = np.empty(0, dtype=np.int64)
        self._marker = np.empty(0, dtype=np.int64)
        self._recent: dict[int, tuple[int, int, int]] = {}

    def __len__(self) -> int:
        return len(self._keys) + len(self._recent)

    def add(self, txn: TxnId, first: int, last: int, marker: int) -> None:
        """Record an abort marker (a second marker for the same transaction changes nothing)."""
        key = txn_key(txn)
        if key in self._recent or self._find(key) >= 0:
            return
        self._recent[key] = (first, last, marker)
        if len(self._recent) >= MERGE_AT:
            self._merge()

    def _find(self, key: int) -> int:
        keys = self._keys
        if not len(keys):
            return -1
        i = int(np.searchsorted(keys, np.uint64(key)))
        if i < len(keys) and int(keys[i]) == key:
            return i
        return -1

    def __contains__(self, txn: TxnId) -> bool:
        key = txn_key(txn)
        return key in self._recent or self._find(key) >= 0

    def contains_key(self, key: int) -> bool:
        return key in self._recent or self._find(key) >= 0

    def contains_keys(self, keys: np.ndarray) -> np.ndarray:
        """For each of ``keys`` (uint64), whether its transaction is in the index."""
        found = np.zeros(len(keys), dtype=bool)
        if len(self._keys) and len(keys):
            i = np.minimum(np.searchsorted(self._keys, keys), len(self._keys) - 1)
            found = self._keys[i] == keys
        if self._recent and len(keys):
            found |= np.isin(keys, np.fromiter(self._recent, dtype=np.uint64, count=len(self._recent)))
        return found

    def get(self, txn: TxnId) -> AbortedTxn | None:
        key = txn_key(txn)
        row = self._recent.get(key)
        if row is not None:
            return AbortedTxn(txn, *row)
        i = self._find(key)
        if i < 0:
            return None
        return AbortedTxn(txn, int(self._first[i]), int(self._last[i]), int(self._marker[i]))

    def _merge(self) -> None:
        if not self._recent:
            return
        keys = np.fromiter(self._recent.keys(), dtype=np.uint64, count=len(self._recent))
        rows = np.array(list(self._recent.values()), dtype=np.int64).reshape(-1, 3)
        allk = np.concatenate([self._keys, keys])
        order = np.argsort(allk, kind="stable")
        self._keys = allk[order]
        self._first = np.concatenate([self._first, rows[:, 0]])[order]
        self._last = np.concatenate([self._last, rows[:, 1]])[order]
        self._marker = np.concatenate([self._marker, rows[:, 2]])[order]
        self._recent = {}

    def overlapping(self, start: int, end: int) -> list[int]:
        """Keys of aborted transactions with data in ``[start, end)`` (or whose marker is in it)."""
        out = [k for k, (f, last, m) in self._recent.items() if (f < end and last >= start) or start <= m < end]
        if len(self._keys):
            mask = ((self._first < end) & (self._last >= start)) | ((self._marker >= start) & (self._marker < end))
            out.extend(int(k) for k in self._keys[mask])
        return out

    def keys_after(self, offset: int) -> list[int]:
        """Keys of aborted transactions whose abort marker is at or after ``offset``."""
        out = [k for k, (_f, _l, m) in self._recent.items() if m >= offset]
        if len(self._keys):
            out.extend(int(k) for k in self._keys[self._marker >= offset])
        return out

    def prune(self, log_start: int) -> int:
        """Drop transactions whose abort marker is below ``log_start`` (retention removed them)."""
        self._merge()
        keep = self._marker >= log_start
        dropped = int(len(keep) - int(keep.sum()))
        if dropped:
            self._keys, self._first = self._keys[keep], self._first[keep]
            self._last, self._marker = self._last[keep], self._marker[keep]
        return dropped

    def to_table(self) -> pa.Table:
        """All rows ordered by abort-marker offset (the order snapshot parts are cut in)."""
        self._merge()
        order = np.argsort(self._marker, kind="stable")
        return pa.table(
            [
                from_numpy(self._keys[order]),
                from_numpy(self._first[order]),
                from_numpy(self._last[order]),
                from_numpy(self._marker[order]),
            ],
            schema=ABORTED_SCHEMA,
        )

    @classmethod
    def from_tables(cls, tables: list[pa.Table]) -> AbortedIndex:
        index = cls()
        if not tables:
            return index
        table = pa.concat_tables(tables)
        keys = to_numpy(table.column("txn"))
        order = np.argsort(keys, kind="stable")
        index._keys = keys[order]
        index._first = to_numpy(table.column("first"))[order]
        index._last = to_numpy(table.column("last"))[order]
        index._marker = to_numpy(table.column("marker"))[order]
        dup = np.flatnonzero(np.diff(index._keys) == 0)
        if len(dup):
            keep = np.ones(len(index._keys), dtype=bool)
            keep[dup + 1] = False
            index._keys, index._first = index._keys[keep], index._first[keep]
            index._last, index._marker = index._last[keep], index._marker[keep]
        return index

    def _check(self) -> None:
        """Invariants: sorted unique keys, aligned columns, first <= last < marker, no key twice."""
        n = len(self._keys)
        if not (len(self._first) == len(self._last) == len(self._marker) == n):
            raise AssertionError("aborted index columns are misaligned")
        if n > 1 and not bool(np.all(self._keys[1:] > self._keys[:-1])):
            raise AssertionError("aborted index keys are not sorted and unique")
        for k, (f, last, m) in self._recent.items():
            if self._find(k) >= 0:
                raise AssertionError(f"key {k} is both recent and sealed")
            if f >= 0 and not f <= last < m:
                raise AssertionError(f"bad aborted range {f}..{last} marker {m}")
        if n and bool(np.any((self._first >= 0) & ((self._first > self._last) | (self._last >= self._marker)))):
            raise AssertionError("bad aborted range in sealed rows")


class SkipRanges:
    """Disjoint, sorted offset ranges ``[first, last]`` of entries never to deliver."""

    __slots__ = ("_firsts", "_lasts")

    def __init__(self) -> None:
        self._firsts: list[int] = []
        self._lasts: list[int] = []

    def __len__(self) -> int:
        return len(self._firsts)

    def add(self, first: int, last: int) -> None:
        """Add a range; ranges arrive in offset order (scan order), adjacent ones merge."""
        if self._lasts and first <= self._lasts[-1] + 1 and first >= self._firsts[-1]:
            self._lasts[-1] = max(self._lasts[-1], last)
            return
        i = bisect.bisect_left(self._firsts, first)
        self._firsts.insert(i, first)
        self._lasts.insert(i, last)

    def covers(self, offset: int) -> bool:
        i = bisect.bisect_right(self._firsts, offset) - 1
        return i >= 0 and self._lasts[i] >= offset

    def covers_many(self, offsets: np.ndarray) -> np.ndarray:
        """:meth:`covers` of each of ``offsets`` (int64), at once."""
        if not self._firsts:
            return np.zeros(len(offsets), dtype=bool)
        firsts = np.asarray(self._firsts, dtype=np.int64)
        lasts = np.asarray(self._lasts, dtype=np.int64)
        i = np.searchsorted(firsts, offsets, side="right") - 1
        return (i >= 0) & (lasts[np.maximum(i, 0)] >= offsets)

    def overlapping(self, start: int, end: int) -> list[tuple[int, int]]:
        i = max(0, bisect.bisect_right(self._firsts, start) - 1)
        out = []
        while i < len(self._firsts) and self._firsts[i] < end:
            if self._lasts[i] >= start:
                out.append((self._firsts[i], self._lasts[i]))
            i += 1
        return out

    def prune(self, log_start: int) -> None:
        i = bisect.bisect_left(self._lasts, log_start)
        del self._firsts[:i], self._lasts[:i]

    def to_list(self) -> list[list[int]]:
        return [[f, last] for f, last in zip(self._firsts, self._lasts, strict=True)]

    @classmethod
    def from_list(cls, rows: list[list[int]]) -> SkipRanges:
        s = cls()
        for f, last in rows:
            s.add(int(f), int(last))
        return s

    def _check(self) -> None:
        for i in range(len(self._firsts)):
            if self._firsts[i] > self._lasts[i]:
                raise AssertionError("skip range with first > last")
            if i and self._firsts[i] <= self._lasts[i - 1]:
                raise AssertionError("skip ranges overlap or are unsorted")
