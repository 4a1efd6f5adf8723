"""Where a partition log's entries are: the offset -> slot index (PROTOCOL.md "Partition log").

Holds :class:`SlotIndex`, what this process remembers without a request (entries by base offset, a bounded
cache, and the tail: the first free slot and the log end offset), and :class:`OffsetSearch`, which finds the
slot of an offset nothing remembers by searching headers in rounds of :data:`SEARCH_PROBES` in flight
together (two at the slot the offsets interpolate to, the rest spread over the bracket).

Invariants: offsets are dense (entry ``n + 1`` begins where entry ``n`` ends) and entries are immutable, so
a remembered entry ``(base offset, slot, record count)`` never goes wrong; retention only removes entries
below the log start, which no lookup asks for. The remembered tail may be stale (others appended since, or
retention ran): followed forward by every read past it, re-checked by the tail search
(:mod:`txn_core.partition.tail`) after ``TAIL_RECHECK_S``; a stale tail costs a lost create race or extra
reads, never a wrong offset.

Locking: :attr:`SlotIndex.lock` guards the tail (``tail``, ``tail_checked``) for those who read it and then
act on it: the tail search (which holds it across its requests) and the appender (which also guards its
chain of appends in flight with it, :mod:`txn_core.partition.appender`). Nothing holding it may take it
again. :meth:`SlotIndex.remember` takes no lock: reads remember on the thread that uses the log, the
appender notes its entries under the lock; a tail moved by a read beside a locked search is still a tail
some entry gave. :class:`OffsetSearch` holds no lock of its own.

Crash windows: none (memory and reads only).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from sortedcontainers import SortedDict

from txn_core.errors import DamagedEntryError, OffsetOutOfRangeError
from txn_core.format.entry import EntryHeader
from txn_core.partition.logstart import LogStartCache
from txn_core.partition.segments import SegmentCatalog
from txn_core.storage.parallel import parallel_map

#: Header reads in flight together in each round of the search for an offset's slot.
SEARCH_PROBES = 8


class SlotIndex:
    """Remembered entries by base offset and the tail, as this process last learned them (no requests).

    ``max_entries`` is asked at each insert (``partition.INDEX_MAX_ENTRIES``, which tests patch): past it the
    older half is forgotten, so the memory of a long-lived reader or writer stays bounded whatever the
    partition's length (a lookup it misses searches headers again)."""

    def __init__(self, *, max_entries: Callable[[], int]) -> None:
        self.max_entries = max_entries
        self.lock = threading.Lock()
        self.tail: tuple[int, int] | None = None  # (next slot, next offset); read and replaced whole
        self.tail_checked = 0.0  # when the tail was last confirmed (monotonic seconds)
        self._entries: SortedDict = SortedDict()  # base_offset -> (slot, record_count)

    def __len__(self) -> int:
        """How many entries are remembered."""
        return len(self._entries)

    def known_tail_slot(self) -> int | None:
        """The first free slot as this process last learned it (no request; None if it never did)."""
        with self.lock:
            return self.tail[0] if self.tail is not None else None

    def note(self, base_offset: int, slot: int, record_count: int) -> None:
        """Remember where an entry is; past ``max_entries()``, forget the older half."""
        index = self._entries
        index[base_offset] = (slot, record_count)
        if len(index) > self.max_entries():
            for key in list(index.islice(0, len(index) // 2)):
                index.pop(key, None)

    def remember(self, slot: int, header: EntryHeader) -> None:
        """Learn from a header read at ``slot``: where its offsets are, and the tail if it lies past it.
        Call on the thread that owns the log's use (not thread-safe against itself)."""
        self.note(header.base_offset, slot, header.record_count)
        tail = self.tail
        if tail is not None and slot >= tail[0]:
            # A reader saw entries past the cached tail: follow them (a stale cache would only cost a
            # lost create race or extra reads, never a wrong offset).
            self.tail = (slot + 1, header.next_offset)

    def advance_to(self, slot: int, offset: int) -> None:
        """Move the cached tail up to ``(slot, offset)``; a tail already past it (a reader saw more) stays.
        Hold :attr:`lock`."""
        if self.tail is None or self.tail[0] < slot:
            self.tail = (slot, offset)

    def remembered(self, offset: int) -> tuple[int, int, int] | None:
        """``(slot, base offset, next offset)`` of the remembered entry beginning nearest at or below
        ``offset`` (it holds ``offset`` only if ``offset < next offset``), or None (no request)."""
        idx = self._entries.bisect_right(offset) - 1
        if idx < 0:
            return None
        base, (slot, count) = self._entries.peekitem(idx)
        return int(slot), int(base), int(base) + int(count)


class OffsetSearch:
    """The slot of an offset: from the log start, the segments and the index when they know it, else by
    searching headers below the readable tail. Given the index it fills, the log start, the segments, the
    readable tail (``(slot, offset)`` where reading stops, :meth:`TailSearch.readable_tail`) and
    ``fetch_header`` (a header read with no effect on caches, safe on any thread)."""

    def __init__(
        self,
        index: SlotIndex,
        starts: LogStartCache,
        segments: SegmentCatalog,
        *,
        readable_tail: Callable[[], tuple[int, int]],
        fetch_header: Callable[[int], EntryHeader],
    ) -> None:
        self.index = index
        self.starts = starts
        self.segments = segments
        self.readable_tail = readable_tail
        self.fetch_header = fetch_header

    def slot_for_offset(self, offset: int) -> int:
        """The slot of the entry containing ``offset`` (or the tail slot when ``offset`` is the end).

        Costs no request when the answer is known: the log start's offset, where every read from the
        earliest offset begins, is at the log start's slot, and remembered entries and opened segments
        know theirs (their offsets lie below the end, so the tail is not needed to check them). Otherwise
        the tail bounds ``offset`` and the slots are searched in rounds of :data:`SEARCH_PROBES` header reads
        in flight together, interpolated and spread: one round for entries of like size, at most about
        ``log8(n)`` rounds whatever their sizes (a bisection read ``log2(n)`` headers one after another).
        """
        start = self.starts.log_start()
        if offset == start.offset:
            return start.slot  # the first entry present begins here (in an empty log, it is the tail)
        if offset > start.offset:
            rolled = self.segments.slot_for_offset(offset)
            if rolled is not None:
                return rolled
            known = self.index.remembered(offset)
            if known is not None and offset < known[2]:
                return known[0]
        tail_slot, end = self.readable_tail()
        if offset < start.offset or offset > end:
            path = self.segments.path
            raise OffsetOutOfRangeError(f"offset {offset} is outside {path}'s range [{start.offset}, {end}]")
        if offset == end:
            return tail_slot
        # Invariant: base(lo) = lo_base <= offset < hi_next = next(hi). Each round reads SEARCH_PROBES headers
        # at once: two at the slot the offsets interpolate to (entries of like size: found in one round), the
        # rest spread evenly over the bracket, which each round narrows at least SEARCH_PROBES-fold.
        lo, hi, lo_base, hi_next = start.slot, tail_slot - 1, start.offset, end
        while lo < hi:
            probes = _search_probes(lo, hi, lo_base, hi_next, offset)
            for slot, (base, header) in zip(probes, parallel_map(self._base_at, probes, leaf=True), strict=True):
                if header is not None:
                    self.index.remember(slot, header)
                if base <= offset:
                    if slot > lo:
                        lo, lo_base = slot, base
                elif slot - 1 < hi:
                    hi, hi_next = slot - 1, base
        return lo

    def known_stop_slot(self, offset: int) -> int | None:
        """The first slot whose entry begins at or after ``offset``, if known without a request: the tail's
        slot at the end this process last learned, else a remembered entry's or an opened segment's."""
        with self.index.lock:
            tail = self.index.tail
        if tail is not None and offset == tail[1]:
            return tail[0]
        known = self.index.remembered(offset)
        if known is not None:
            slot, base, after = known
            if base == offset:
                return slot
            if offset <= after:
                return slot + 1
        span = self.segments.entry_span(offset)
        if span is not None:
            slot, base, _ = span
            return slot if base == offset else slot + 1
        return None

    def entry_span(self, offset: int) -> tuple[int, int, int]:
        """``(slot, base offset, next offset)`` of the entry containing ``offset`` (below the readable end).

        Costs :meth:`slot_for_offset`'s requests, then none when the entry is remembered (the search
        remembers every header it reads) or in an opened segment, else one header read."""
        slot = self.slot_for_offset(offset)
        known = self.index.remembered(offset)
        if known is not None and known[0] == slot and offset < known[2]:
            return known
        header = self.fetch_header(slot)
        return slot, header.base_offset, header.next_offset

    def _base_at(self, slot: int) -> tuple[int, EntryHeader | None]:
        """Where the entry at ``slot`` begins, with its header to remember; the previous entry's end and None
        when it is damaged. Runs on any thread (it only fetches)."""
        try:
            header = self.fetch_header(slot)
        except DamagedEntryError:
            return self.fetch_header(slot - 1).next_offset, None  # slot > the log start's: probes lie above it
        return header.base_offset, header


def _search_probes(lo: int, hi: int, lo_base: int, hi_next: int, offset: int) -> list[int]:
    """Slots in ``(lo, hi]`` whose headers one round of :meth:`OffsetSearch.slot_for_offset` reads (sorted)."""
    if hi - lo <= SEARCH_PROBES:
        return list(range(lo + 1, hi + 1))
    guess = lo + (offset - lo_base) * (hi - lo + 1) // max(1, hi_next - lo_base)
    step = (hi - lo) / (SEARCH_PROBES - 1)
    spread = {lo + round(step * i) for i in range(1, SEARCH_PROBES - 1)}
    return sorted({min(max(slot, lo + 1), hi) for slot in (guess, guess + 1, *spread)})
