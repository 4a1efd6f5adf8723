"""The segments of one partition log as a reader knows them (PROTOCOL.md "Segments", "Readers").

A :class:`SegmentCatalog` answers "which segment holds slot ``s``" from a cached listing of
``<path>/segments/`` and reads entries, headers and byte ranges from opened segments. It makes no protocol
decision of its own: :class:`txn_core.partition.partition.PartitionLog` decides when a listing is too old to trust
(a missing loose slot), and the readers decide what to do with the entries.

Invariants:

* **A slot is taken from the segment with the greatest first slot at or below it**, and only if that
  segment's end lies above it (known once the segment is opened). Any segment holding a slot holds the
  same entry, so which one answers never changes a result.
* **The first listing does not delay the first read**: it is started in the background when the log start
  is first read (:meth:`SegmentCatalog.start_listing`), or taken at the first missing loose slot; until it
  lands, slots read as not covered (their loose objects hold the same entries).
* **Bounded memory**: at most :data:`OPEN_SEGMENTS` opened indexes (160 bytes per entry) with the first
  :data:`HEAD_BYTES` of their entries, plus one integer per segment listed.
* **Thread-safe**: lookups run on readers' threads, reads on the leaf pool. Opening a segment is done once
  (a lock per segment: other threads wanting it wait for the one reading it, which is running), and a
  listing is made once for all who want one at a time (they wait for its maker, which waits on no pool):
  the pools cannot deadlock.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np
import pyarrow as pa

from txn_core.errors import CorruptDataError, ObjectNotFoundError, StorageError
from txn_core.format import paths
from txn_core.format.entry import EntryHeader
from txn_core.format.segment import (
    ROW_SIZE,
    SEGMENT_HEADER_SIZE,
    Inlined,
    SegmentIndex,
    SegmentSpan,
    decode_segment_header,
)
from txn_core.logs import get_logger
from txn_core.storage.base import Storage
from txn_core.storage.parallel import submit

logger = get_logger(__name__)

#: Opened segment indexes one catalog keeps (a sequential reader needs the current one and the next).
OPEN_SEGMENTS = 3
#: Entries a segment holds at most by default; also the row count assumed when opening a segment whose
#: end the listing does not tell (the last one): its first read is header + index of this many rows.
SEGMENT_MAX_ENTRIES = 8192
#: The read opening a segment also fetches this many bytes of entries after the index: a sequential reader
#: takes its first entries from them without another round trip (kept while the segment is open).
HEAD_BYTES = 1 << 20
#: ... and this many when a reader about to start at the segment opens it ahead (:meth:`SegmentCatalog.open_ahead`):
#: the span reads a reader issues (``readahead.CHUNK_BYTES``), so a segment of up to that much is read whole.
AHEAD_BYTES = 4 << 20

#: One entry read from a segment: slot, header, entry bytes, inlined rows, name for errors.
SegmentEntry = tuple[int, EntryHeader, Any, Inlined | None, str]


def parse_first(name: str) -> int | None:
    """The first slot a listed name stands for, or None for a name that is not a segment."""
    if name.endswith("/") or len(name) != 20 or not name.isdigit():
        return None
    return int(name)


class SegmentCatalog:
    """Segments of the partition log at ``path`` (see module doc)."""

    def __init__(self, storage: Storage, path: str, *, monotonic: Callable[[], float]) -> None:
        self.storage = storage
        self.path = path
        self._monotonic = monotonic  # the log clock's (txn_core.clock): the listing's age
        self.prefix = paths.segments(path)
        self._lock = threading.Lock()
        self._firsts: list[int] | None = None  # replaced, never mutated
        self._listed_at = float("-inf")
        self._flight: Future[list[int]] | None = None  # the listing under way
        self._starting = False  # a background listing was submitted and has not run yet
        self._ends: dict[int, int] = {}
        self._open: OrderedDict[int, SegmentIndex] = OrderedDict()
        self._heads: dict[int, Any] = {}  # first slot -> the entries' bytes read with the index
        self._opening: dict[int, threading.Lock] = {}

    def key(self, first: int) -> str:
        return self.prefix + paths.slot_name(first)

    # --- listing --------------------------------------------------------------------------------

    def _list(self) -> list[int]:
        return sorted(f for f in (parse_first(n) for n in self.storage.list(self.prefix)) if f is not None)

    def refresh(self, also: Callable[[], object] | None = None) -> list[int]:
        """List the segments now and return their first slots. Callers at the same time share one LIST (a
        reader's reads ahead that all miss at once): a listing under way answers for them, being younger
        than any a reader trusts (PROTOCOL.md "Segments", "Readers"). ``also`` (the log start's re-read)
        runs next to the LIST for the caller that makes it (on a thread of its own: the maker of a listing
        others wait for never waits on the shared pools), after it for one that shares it."""
        with self._lock:
            flight = self._flight
            mine = flight is None
            if flight is None:
                flight = self._flight = Future()
        if not mine:
            firsts = flight.result()
            if also is not None:
                also()
            return firsts
        started = self._monotonic()
        try:
            joined = _beside(also) if also is not None else None
            firsts = self._list()
            if joined is not None:
                joined()
        except BaseException as exc:
            with self._lock:
                self._flight = None
            flight.set_exception(exc)
            raise
        with self._lock:
            self._flight = None
            if started >= self._listed_at:
                self._firsts, self._listed_at = firsts, started
                listed = set(firsts)
                for first in [f for f in self._open if f not in listed]:
                    del self._open[first]
                    self._heads.pop(first, None)
        flight.set_result(firsts)
        return firsts

    def listing(self) -> list[int] | None:
        """The cached listing, or None when there is none yet (lookups then take loose objects, which hold
        the same entries; a missing one makes the caller list)."""
        return self._firsts

    def start_listing(self) -> list[int] | None:
        """:meth:`listing`, starting one in the background if there is none and none is under way (a first
        use that lists the log start anyway overlaps the two)."""
        with self._lock:
            start = self._firsts is None and self._flight is None and not self._starting
            self._starting = self._starting or start
        if start:  # submitted outside the lock: from a leaf thread it runs inline
            submit(self._background_refresh, leaf=True)
        return self._firsts

    def _background_refresh(self) -> None:
        try:
            self.refresh()
        except StorageError as exc:  # the first missing slot lists again
            logger.debug("%s: background listing of segments failed: %s", self.path, exc)
        finally:
            with self._lock:
                self._starting = False

    def starts_after(self, slot: int) -> bool:
        """Whether a segment in the cached listing starts after ``slot``: entries follow it. A slot missing
        below such a segment and held by none is a hole (a lost entry: the one gap a chain may have)."""
        firsts = self._firsts
        return firsts is not None and bool(firsts) and firsts[-1] > slot

    def listed_within(self, seconds: float) -> bool:
        """Whether the cached listing is younger than ``seconds``."""
        return self._firsts is not None and self._monotonic() - self._listed_at < seconds

    def _covering(self, slot: int, firsts: list[int]) -> tuple[int, int | None] | None:
        """(first slot, next segment's first slot or None) of the segment that may hold ``slot``."""
        i = bisect.bisect_right(firsts, slot) - 1
        if i < 0:
            return None
        return firsts[i], firsts[i + 1] if i + 1 < len(firsts) else None

    def _drop(self, first: int) -> None:
        """A listed segment turned out gone (retention deleted it): forget it until the next listing."""
        with self._lock:
            if self._firsts is not None:
                self._firsts = [f for f in self._firsts if f != first]
            self._listed_at = float("-inf")
            self._open.pop(first, None)
            self._heads.pop(first, None)
            self._ends.pop(first, None)

    # --- opening --------------------------------------------------------------------------------

    def open(self, first: int, head_bytes: int = HEAD_BYTES) -> SegmentIndex:
        """The segment starting at ``first``, opened (header and index: one ranged read, or two for an
        index larger than the first read, with ``head_bytes`` of its entries). :class:`ObjectNotFoundError`
        if it does not exist."""
        with self._lock:
            seg = self._open.get(first)
            if seg is not None:
                self._open.move_to_end(first)
                return seg
            gate = self._opening.setdefault(first, threading.Lock())
        with gate:
            with self._lock:
                seg = self._open.get(first)
                if seg is not None:
                    return seg
                firsts = self._firsts or []
            i = bisect.bisect_left(firsts, first)
            upper = firsts[i + 1] if i < len(firsts) and firsts[i] == first and i + 1 < len(firsts) else None
            rows = (upper - first) if upper is not None else SEGMENT_MAX_ENTRIES
            key = self.key(first)
            block = pa.py_buffer(self.storage.read(key, 0, SEGMENT_HEADER_SIZE + ROW_SIZE * rows + head_bytes))
            header, seg = SegmentIndex.parse(key, block)
            head = None
            if seg is None:
                rest = self.storage.read(key, len(block), header.index_end)
                seg = SegmentIndex.from_bytes(key, header, block.to_pybytes()[SEGMENT_HEADER_SIZE:] + rest)
            elif len(block) > header.index_end:
                head = block.slice(header.index_end)
            with self._lock:
                self._open[first] = seg
                self._ends[first] = seg.end
                if head is not None:
                    self._heads[first] = head
                while len(self._open) > OPEN_SEGMENTS:
                    self._heads.pop(self._open.popitem(last=False)[0], None)
                self._opening.pop(first, None)
            return seg

    def open_ahead(self, slot: int) -> None:
        """Open the segment the cached listing shows holding ``slot`` in the background, with
        :data:`AHEAD_BYTES` of its entries (a reader about to start there overlaps the open with what it
        reads first, its buffer snapshot, and finds a small segment's entries read). Errors are left to the
        reader's own open, which waits for this one rather than reading again."""
        firsts = self.listing()
        covering = self._covering(slot, firsts) if firsts else None
        if covering is None or covering[0] in self._open:
            return
        first = covering[0]

        def run() -> None:
            try:
                self.open(first, AHEAD_BYTES)
            except (StorageError, CorruptDataError) as exc:
                logger.debug("%s: opening segment %d ahead failed: %s", self.path, first, exc)

        submit(run, leaf=True)

    def end_of(self, first: int) -> int:
        """The end slot of the segment starting at ``first`` (its 80-byte header, unless known)."""
        end = self._ends.get(first)
        if end is None:
            key = self.key(first)
            end = decode_segment_header(self.storage.read(key, 0, SEGMENT_HEADER_SIZE), key).end_slot
            with self._lock:
                self._ends[first] = end
        return end

    def known_chain_end(self) -> int | None:
        """The end of the last segment in the cached listing when it is known without a request (None:
        no listing, no segment, or not opened yet)."""
        firsts = self._firsts
        return self._ends.get(firsts[-1]) if firsts else None

    def chain_end(self) -> int | None:
        """The end of the segment with the greatest first slot in the cached listing (None: no segment).

        Callers that need it exact (appenders, rollers) refresh the listing first."""
        for _attempt in range(3):
            firsts = self._firsts
            if firsts is None:
                firsts = self.refresh()
            if not firsts:
                return None
            try:
                return self.end_of(firsts[-1])
            except ObjectNotFoundError:  # deleted by retention since the listing
                self.refresh()
        return None

    # --- lookups --------------------------------------------------------------------------------

    def _segment_for(self, slot: int) -> SegmentIndex | None:
        """The opened segment holding ``slot``, by the cached listing; None when none does (or it vanished)."""
        firsts = self.listing()
        if not firsts:
            return None
        covering = self._covering(slot, firsts)
        if covering is None:
            return None
        first, _upper = covering
        end = self._ends.get(first)
        if end is not None and slot >= end:
            return None
        try:
            seg = self.open(first)
        except ObjectNotFoundError:
            self._drop(first)
            return None
        return seg if seg.holds(slot) else None

    def plan(self, slot: int, max_slots: int, max_bytes: int) -> tuple[int, bool]:
        """How many slots from ``slot`` on to read from a segment in one request, by what is known without a
        request: ``(0, True)`` when no segment holds ``slot`` as far as known; ``exact`` False when the
        segment is not opened yet (the count is then an upper bound, the read returns what it holds)."""
        firsts = self.listing()
        if not firsts:
            return 0, True
        covering = self._covering(slot, firsts)
        if covering is None:
            return 0, True
        first, upper = covering
        seg = self._open.get(first)
        if seg is not None:
            return (self._span(seg, slot, max_slots, max_bytes), True) if seg.holds(slot) else (0, True)
        end = self._ends.get(first)
        if end is not None:
            if slot >= end:
                return 0, True
            upper = end
        bound = upper if upper is not None else slot + max_slots
        return max(1, min(bound - slot, max_slots)), False

    def covers(self, slot: int) -> bool:
        """Whether a segment in the cached listing holds ``slot`` (opens it if needed)."""
        return self._segment_for(slot) is not None

    def header(self, slot: int) -> EntryHeader | None:
        """``slot``'s header from the segment holding it (no request once opened), or None."""
        seg = self._segment_for(slot)
        return seg.entry_header(slot) if seg is not None else None

    def headers(self, slot: int, count: int) -> list[EntryHeader]:
        """Up to ``count`` headers from ``slot`` on, from the segment holding it ([] when none does)."""
        seg = self._segment_for(slot)
        if seg is None:
            return []
        return seg.entry_headers(slot, min(seg.end, slot + count))

    def read(self, slot: int, count: int, max_bytes: int) -> list[SegmentEntry]:
        """Up to ``count`` entries from ``slot`` on (at least one, at most about ``max_bytes``) from the
        segment holding it, in one ranged read; [] when no segment holds ``slot`` or it vanished."""
        got = self._read(slot, count, max_bytes)
        if got is None:
            return []
        seg, block, lo, n = got
        return seg.entries(slot, slot + n, block, lo)

    def read_span(self, slot: int, count: int, max_bytes: int) -> SegmentSpan | None:
        """What :meth:`read` reads, as a :class:`SegmentSpan` (no object per entry); None when no segment
        holds ``slot`` or it vanished."""
        got = self._read(slot, count, max_bytes)
        if got is None:
            return None
        seg, block, lo, n = got
        return seg.span(slot, slot + n, block, lo)

    def _read(self, slot: int, count: int, max_bytes: int) -> tuple[SegmentIndex, Any, int, int] | None:
        seg = self._segment_for(slot)
        if seg is None:
            return None
        n = self._span(seg, slot, count, max_bytes)
        lo, hi = seg.byte_range(slot, slot + n)
        head = self._heads.get(seg.first)
        start = seg.header.index_end
        if head is not None and hi <= start + len(head):
            block, lo = head, start  # read with the index: no request
        else:
            try:
                block = pa.py_buffer(self.storage.read(seg.key, lo, hi))
            except ObjectNotFoundError:
                self._drop(seg.first)
                return None
        return seg, block, lo, n

    def _span(self, seg: SegmentIndex, slot: int, max_slots: int, max_bytes: int) -> int:
        """Slots from ``slot`` to read at once (:func:`count_within`), ending where the bytes read with the
        index end when ``slot`` lies in them (those come without a request)."""
        n = count_within(seg, slot, max_slots, max_bytes)
        head = self._heads.get(seg.first)
        if head is not None:
            head_end = seg.header.index_end + len(head)
            lo, hi = seg.byte_range(slot, slot + n)
            if hi > head_end and lo < head_end:
                inside = count_within(seg, slot, n, head_end - lo)
                if seg.byte_range(slot, slot + inside)[1] <= head_end:
                    return inside
        return n

    def slot_for_offset(self, offset: int) -> int | None:
        """The slot of the entry containing ``offset`` if an opened segment holds it (no request)."""
        span = self.entry_span(offset)
        return span[0] if span is not None else None

    def entry_span(self, offset: int) -> tuple[int, int, int] | None:
        """``(slot, base offset, next offset)`` of the entry containing ``offset`` if an opened segment holds
        it (no request)."""
        with self._lock:
            opened = list(self._open.values())
        for seg in opened:
            span = seg.entry_span(offset)
            if span is not None:
                return span
        return None


def _beside(fn: Callable[[], object]) -> Callable[[], None]:
    """Run ``fn`` on a thread of its own; returns a join that raises what ``fn`` raised."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=run, name="txnlog-listing", daemon=True)
    thread.start()

    def join() -> None:
        thread.join()
        if failed:
            raise failed[0]

    return join


def count_within(seg: SegmentIndex, slot: int, max_slots: int, max_bytes: int) -> int:
    """Slots from ``slot`` on, at most ``max_slots`` and (beyond the first) ``max_bytes`` of ``seg``."""
    i = slot - seg.first
    j = min(seg.header.count, i + max(1, max_slots))
    rows = seg.rows
    ends = rows["position"][i:j] + rows["length"][i:j] + rows["data_len"][i:j]
    n = int(np.searchsorted(ends, int(rows["position"][i]) + max_bytes, side="right"))
    return max(1, min(n, j - i))
