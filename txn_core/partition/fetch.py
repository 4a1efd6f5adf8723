"""Reading a partition log's entries, through its segments and its lost-entry records (PROTOCOL.md "Reading",
"Segments" "Readers", "Damage").

Holds :class:`Entry` (a read entry), :func:`entry_of_lost` (what readers see in place of an entry marked
lost) and :class:`EntryFetcher`, which reads a slot's header or whole entry: from the segment holding it in
the cached listing, else its loose object ``<path>/log/<020d slot>``.

Invariants:

* **Damage is confirmed by a second read** (a read can be corrupted on its way): an entry that fails its
  checks twice in a row is damaged. Reading it gives the header made up from its lost-entry record when an
  operator marked it lost (the real header, when only its payload is damaged), else raises
  :class:`DamagedEntryError`.
* **A missing loose slot is not reported missing on a stale listing**: it is looked up again in the segments
  after :meth:`MissingSlots.relist_after_miss` (it may have been rolled and deleted since the listing), and,
  when an entry after it is known, after a fresh listing and log start (:meth:`MissingSlots.recheck`); a
  miss that is then a hole (:meth:`MissingSlots.hole`) is damage like any other.
* Entries are immutable, and so are lost-entry records once they exist: both are safe to remember.

Locking: none. ``fetch_*`` change no cache but the lost-entry records read (a dict, set whole per slot) and
what :class:`MissingSlots` and the segments learn, so they may run on any thread
(:mod:`txn_core.partition.readahead`); ``read_*`` also remember the header in the index
(:meth:`SlotIndex.remember`: on the thread that uses the log).

Crash windows: none (it only reads).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from txn_core.errors import CorruptDataError, DamagedEntryError, ObjectNotFoundError
from txn_core.format.entry import HEADER_SIZE, EntryHeader, decode_header, verify_payload
from txn_core.format.segment import Inlined, SegmentSpan
from txn_core.format.slotlog import SlotLog
from txn_core.partition.holes import MissingSlots
from txn_core.partition.index import SlotIndex
from txn_core.partition.lost import LostEntry, damaged_entry_error, read_lost
from txn_core.partition.segments import SegmentCatalog, SegmentEntry
from txn_core.storage.base import Storage

T = TypeVar("T")

#: Entries of a segment span made at once when a reader takes them one by one (:class:`EntrySpan`).
MADE_AT_ONCE = 256


@dataclass(frozen=True, slots=True)
class Entry:
    """A read entry: header, slot, and the raw object bytes (payload follows the header).

    ``lost`` is set for an entry whose records are gone (PROTOCOL.md "Damage"): its header is then the
    real one (only the payload is damaged) or, of kind LOST, the one its lost-entry record gives.

    An entry read from a segment carries the rows of a DATA_REF in ``inlined``; a loose entry carries the
    log that read it in ``source`` (a DATA_REF whose staged object is gone is re-read from a segment)."""

    slot: int
    header: EntryHeader
    data: Any  # the whole object: a pyarrow.Buffer (or bytes)
    key: str
    lost: LostEntry | None = None
    inlined: Inlined | None = None
    source: Any = None  # the PartitionLog that read a loose entry

    def payload(self) -> memoryview:
        return verify_payload(self.header, self.data, self.key)

    @property
    def nbytes(self) -> int:
        """Bytes this entry holds in memory (inlined rows included)."""
        extra = self.inlined.data if self.inlined is not None and self.inlined.data is not None else b""
        return len(self.data) + len(extra)


def entry_of_lost(lost: LostEntry, header: EntryHeader | None = None) -> Entry:
    """The entry readers see in place of one marked lost: no data, and its LOST header, or ``header`` (the
    entry's own, when only its payload is damaged)."""
    return Entry(lost.slot, header or lost.header(), b"", lost.key, lost)


def _segment_entry(item: SegmentEntry) -> Entry:
    slot, header, data, inlined, where = item
    return Entry(slot, header, data, where, inlined=inlined)


def span_entry(span: SegmentSpan, i: int) -> Entry:
    """The ``i``-th entry of ``span``, made alone."""
    slot = span.first + i
    return _segment_entry(span.entries(slot, slot + 1)[0])


class EntrySpan:
    """Entries read from a segment at once (:class:`SegmentSpan`), made when asked for, :data:`MADE_AT_ONCE`
    at a time (their headers built from the index's columns together): a reader that takes them column by
    column (:mod:`txn_core.partition.runs`) makes none."""

    __slots__ = ("_made", "_made_from", "span")

    def __init__(self, span: SegmentSpan) -> None:
        self.span = span
        self._made: list[Entry] = []
        self._made_from = 0

    def __len__(self) -> int:
        return len(self.span)

    def entry(self, i: int) -> Entry:
        k = i - self._made_from
        if not 0 <= k < len(self._made):
            first = self.span.first + i
            end = min(first + MADE_AT_ONCE, self.span.end)
            self._made = [_segment_entry(item) for item in self.span.entries(first, end)]
            self._made_from, k = i, 0
        return self._made[k]


class EntryFetcher:
    """Reads the entries of the partition log at ``path``. Given the storage, its slot log and segments,
    :class:`MissingSlots` (what a miss is), the index that ``read_*`` fill, and ``source``: the log stamped
    on the loose entries it reads (:attr:`Entry.source`)."""

    def __init__(
        self,
        storage: Storage,
        path: str,
        entries: SlotLog,
        segments: SegmentCatalog,
        missing: MissingSlots,
        index: SlotIndex,
        *,
        source: object,
    ) -> None:
        self.storage = storage
        self.path = path
        self.entries = entries
        self.segments = segments
        self.missing = missing
        self.index = index
        self.source = source
        self._lost: dict[int, LostEntry] = {}  # lost-entry records read (immutable once they exist)

    # --- reads that remember --------------------------------------------------------------------

    def read_header(self, slot: int) -> EntryHeader:
        """:meth:`fetch_header`, remembered in the index."""
        header = self.fetch_header(slot)
        self.index.remember(slot, header)
        return header

    def read_entry(self, slot: int) -> Entry:
        """Read a whole entry (header verified; payload verified lazily by :meth:`Entry.payload`)."""
        entry = self.fetch_entry(slot)
        self.index.remember(slot, entry.header)
        return entry

    # --- headers --------------------------------------------------------------------------------

    def fetch_header(self, slot: int) -> EntryHeader:
        """The verified header of ``slot`` (one ranged read, or a segment's index), or the LOST header of an
        entry marked lost; :class:`DamagedEntryError` for a damaged entry not marked lost. Damage is
        confirmed by a second read (a read can be corrupted on its way). No effect on the caches but the
        lost-entry records it reads, so it may run on any thread (:mod:`txn_core.partition.readahead`)."""
        return self._rolled_or_loose(slot, self.segments.header, self._fetch_loose_header, LostEntry.header)

    def _fetch_loose_header(self, slot: int) -> EntryHeader:
        key = self.entries.key(slot)
        try:
            return decode_header(self.storage.read(key, 0, HEADER_SIZE), key)
        except CorruptDataError:
            pass
        try:
            return decode_header(self.storage.read(key, 0, HEADER_SIZE), key)
        except CorruptDataError as exc:
            return self._lost_or_raise(slot, exc).header()

    def fetch_headers(self, slot: int, count: int) -> list[EntryHeader]:
        """Headers from ``slot`` on: up to ``count`` from the segment holding ``slot`` (its index), else
        the loose entry's alone (see :meth:`fetch_header`)."""
        return self.segments.headers(slot, count) or [self.fetch_header(slot)]

    # --- whole entries --------------------------------------------------------------------------

    def fetch_entry(self, slot: int) -> Entry:
        """The whole entry at ``slot`` in one request (from a segment if one holds it), header verified and
        length checked (see :meth:`fetch_header` for damage). An entry marked lost comes with its record as
        ``lost`` and no data, with its real header when only its payload is damaged."""
        return self._rolled_or_loose(slot, self._segment_entry, self._fetch_loose_entry, entry_of_lost)

    def _fetch_loose_entry(self, slot: int) -> Entry:
        try:
            return self._read_entry(slot)
        except CorruptDataError:
            pass
        try:
            return self._read_entry(slot)
        except CorruptDataError as exc:
            header = exc.header if isinstance(exc, DamagedEntryError) else None
            lost = self._lost_or_raise(slot, exc)
            return entry_of_lost(lost, header)

    def _read_entry(self, slot: int) -> Entry:
        key = self.entries.key(slot)
        data = self.storage.read_buffer(key)
        header = decode_header(data, key)
        if len(data) != HEADER_SIZE + header.payload_len:
            check = f"truncated: {len(data)} bytes, header says {HEADER_SIZE + header.payload_len}"
            raise self.damaged(slot, CorruptDataError(check, key, check), header)
        return Entry(slot, header, data, key, source=self.source)

    def fetch_entries(self, slot: int, count: int, max_bytes: int) -> list[Entry] | EntrySpan:
        """Entries from ``slot`` on: up to ``count`` (and about ``max_bytes``) from the segment holding
        ``slot`` in one ranged read, as an :class:`EntrySpan`; else the loose entry alone (see
        :meth:`fetch_entry`)."""
        span = self.segments.read_span(slot, count, max_bytes)
        if span is not None:
            return EntrySpan(span)
        return [self.fetch_entry(slot)]

    def rolled_entry(self, slot: int) -> Entry | None:
        """``slot``'s entry from a segment, after a fresh listing (None: no segment holds it). For a loose
        DATA_REF whose staged object is gone because the slot was rolled (PROTOCOL.md "Segments")."""
        self.segments.refresh()
        return self._segment_entry(slot)

    def _segment_entry(self, slot: int) -> Entry | None:
        """``slot``'s entry from the segment holding it in the current listing, or None."""
        got = self.segments.read(slot, 1, 0)
        return _segment_entry(got[0]) if got else None

    def _rolled_or_loose(
        self,
        slot: int,
        rolled: Callable[[int], T | None],
        loose: Callable[[int], T],
        marked: Callable[[LostEntry], T],
    ) -> T:
        """``rolled(slot)`` if a listed segment holds ``slot``, else ``loose(slot)``; a loose slot found
        missing is looked up once more in the segments after :meth:`MissingSlots.relist_after_miss` (it may
        have been rolled and deleted since the listing was taken) before the miss is raised. A miss that is a
        hole (:meth:`MissingSlots.hole`) is damage: ``marked(record)`` when the slot was marked lost, else
        :class:`DamagedEntryError`."""
        got = rolled(slot)
        if got is not None:
            return got
        try:
            return loose(slot)
        except ObjectNotFoundError:
            later = self.missing.relist_after_miss(slot)
            got = rolled(slot)
            if got is not None:
                return got
            if not later:
                raise
        self.missing.recheck()
        got = rolled(slot)
        if got is not None:
            return got
        if not self.missing.hole(slot):
            raise ObjectNotFoundError(f"{self.entries.key(slot)} not found", self.entries.key(slot))
        return marked(self._lost_or_raise(slot, self.missing.missing_check(slot)))

    # --- damage and lost entries ----------------------------------------------------------------

    def lost_entry(self, slot: int) -> LostEntry | None:
        """The lost-entry record of ``slot``, if an operator marked it lost (one GET; remembered)."""
        lost = self._lost.get(slot)
        if lost is None:
            lost = read_lost(self.storage, self.path, slot)
            if lost is not None:
                self._lost[slot] = lost
        return lost

    def _lost_or_raise(self, slot: int, exc: CorruptDataError) -> LostEntry:
        lost = self.lost_entry(slot)
        if lost is None:
            if isinstance(exc, DamagedEntryError):
                raise exc
            raise self.damaged(slot, exc) from exc
        return lost

    def damaged(self, slot: int, exc: CorruptDataError, header: EntryHeader | None = None) -> DamagedEntryError:
        """The error for the damaged entry at ``slot`` (``exc`` says which check failed). With its ``header``
        intact, the damage lies past it: ``txnlog maintenance damaged`` lists it with ``--verify-payloads``."""
        return damaged_entry_error(self.path, slot, exc, header, payload=header is not None)
