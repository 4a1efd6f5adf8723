"""One partition log: entries in a slot log, with dense record offsets (PROTOCOL.md "Partition log").

Entry ``n`` lives at ``<path>/log/<020d n>``. Its header carries its ``base_offset``; entry ``n+1``'s base
offset is entry ``n``'s ``base_offset + record_count``, so offsets are dense and never collide. Slots rolled
into segments (PROTOCOL.md "Segments") are read from them; ``<path>/start/`` holds the log start
(PROTOCOL.md "Retention"); an entry that fails its checks, or a missing one with later ones present (a
hole), is damage (PROTOCOL.md "Damage").

:class:`PartitionLog` builds the parts of one partition log, hands each exactly what it uses, and forwards
its API to them. Each part's module states its invariants, its locking and its crash windows:

* :mod:`~txn_core.partition.logstart`: the log start (:class:`LogStart`), re-read when stale;
* :mod:`~txn_core.partition.index`: the offset -> slot index (remembered entries and the cached tail, with
  the lock that guards the tail) and the search for an offset's slot;
* :mod:`~txn_core.partition.holes`: what a missing loose slot is (rolled, removed by retention, a hole, the
  log end) and the probes past it;
* :mod:`~txn_core.partition.fetch`: reading headers and entries (:class:`Entry`) through segments and
  lost-entry records;
* :mod:`~txn_core.partition.tail`: the tail search (where the log ends);
* :mod:`~txn_core.partition.appender`: appends (:class:`AppendResult`), pipelined within a process
  (:mod:`~txn_core.partition.appendchain`).

The knobs below are defined here and read at each use, through the callables the parts are given: tests and
deployments patch them on this module. A :class:`PartitionLog` pickles as its storage, path and clock (Spark
ships it to executors); what it learned is not shipped.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any

from txn_core.clock import Clock, monotonic
from txn_core.errors import ConfigurationError, CorruptDataError, DamagedEntryError
from txn_core.format import paths
from txn_core.format.entry import CarriedMarker, EntryHeader, EntryKind, Payload
from txn_core.format.ids import TxnId
from txn_core.format.slotlog import SlotLog
from txn_core.partition.appender import Appender, AppendResult
from txn_core.partition.fetch import Entry, EntryFetcher, EntrySpan, entry_of_lost
from txn_core.partition.holes import HOLE_PROBES, HOLE_PROBES_CHEAP, MISSING_CHECK, MissingSlots
from txn_core.partition.index import SEARCH_PROBES, OffsetSearch, SlotIndex
from txn_core.partition.logstart import LogStart, LogStartCache
from txn_core.partition.lost import LostEntry
from txn_core.partition.segments import SegmentCatalog
from txn_core.partition.tail import TailSearch
from txn_core.storage.base import Storage
from txn_core.storage.parallel import parallel_map

__all__ = [
    "HOLE_PROBES",
    "HOLE_PROBES_CHEAP",
    "INDEX_MAX_ENTRIES",
    "LOG_START_RECHECK_S",
    "MISSING_CHECK",
    "SEARCH_PROBES",
    "TAIL_RECHECK_S",
    "AppendResult",
    "Entry",
    "EntrySpan",
    "LogStart",
    "PartitionLog",
    "entry_of_lost",
]

#: A cached tail older than this is re-checked before appending (see PROTOCOL.md "Retention").
TAIL_RECHECK_S = 60.0
#: Entries whose slot a process remembers per partition (a cache: a lookup it misses bisects headers).
#: Bounds the memory of a long-lived reader or writer, whatever the partition's length.
INDEX_MAX_ENTRIES = 65_536
#: A cached log start is re-read (one LIST) when older than this. Until then a slot deleted by retention
#: that this process never saw exist reads as the log end: planning and polling see no new data for up to
#: this long after retention removed unread entries; they never see a wrong offset or lost row.
LOG_START_RECHECK_S = 5.0


class PartitionLog:
    """Append to and read one partition log. Thread-safe; one instance per (process, log path)."""

    def __init__(self, storage: Storage, path: str, *, clock: Clock) -> None:
        self.storage = storage
        self.path = path
        self.clock: Clock = clock
        self.monotonic = monotonic(clock)  # the clock's monotonic seconds: cache ages (txn_core.clock)
        self.entries = SlotLog(storage, paths.entries(path))
        self.segments = SegmentCatalog(storage, path, monotonic=self.monotonic)
        # The parts, each given what it uses; the knobs through lambdas, read at each use (patched here).
        self._starts = LogStartCache(
            storage, path, self.segments, monotonic=self.monotonic, recheck_s=lambda: LOG_START_RECHECK_S
        )
        self._index = SlotIndex(max_entries=lambda: INDEX_MAX_ENTRIES)
        self._missing = MissingSlots(
            self.entries,
            self.segments,
            self._starts,
            self._index,
            monotonic=self.monotonic,
            log_start_recheck_s=lambda: LOG_START_RECHECK_S,
            tail_recheck_s=lambda: TAIL_RECHECK_S,
            listed_end=lambda: self._tail.listed_end(),  # noqa: PLW0108 (the tail search is made below)
        )
        self._fetcher = EntryFetcher(
            storage, path, self.entries, self.segments, self._missing, self._index, source=self
        )
        self._tail = TailSearch(
            self._index,
            self._starts,
            self.segments,
            self.entries,
            self._missing,
            self._fetcher,
            monotonic=self.monotonic,
            recheck_s=lambda: TAIL_RECHECK_S,
        )
        self._offsets = OffsetSearch(
            self._index,
            self._starts,
            self.segments,
            readable_tail=self._tail.readable_tail,
            fetch_header=self._fetcher.fetch_header,
        )
        self._appender = Appender(
            storage, self.entries, self._index, self._tail, self._fetcher, monotonic=self.monotonic
        )

    def __getstate__(self) -> dict[str, object]:
        return {"storage": self.storage, "path": self.path, "clock": self.clock}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["storage"], state["path"], clock=state["clock"])  # type: ignore[misc]

    @property
    def _start_checked(self) -> float:
        """When the cached log start was read (monotonic seconds); tests set it to 0 to force a re-read."""
        return self._starts.checked

    @_start_checked.setter
    def _start_checked(self, value: float) -> None:
        self._starts.checked = value

    # --- log start (retention): txn_core.partition.logstart, txn_core.partition.holes -----------

    def log_start(self, refresh: bool = False) -> LogStart:
        """The log start: the newest ``<path>/start/<slot>`` marker, else slot 0 / offset 0."""
        return self._starts.log_start(refresh)

    def recent_log_start(self, max_staleness_s: float | None = None) -> LogStart:
        """The log start, re-read (one LIST) when the cached value is older than ``max_staleness_s``
        (default :data:`LOG_START_RECHECK_S`)."""
        return self._starts.recent_log_start(max_staleness_s)

    def log_start_for(self, offset: int) -> LogStart:
        """The recent log start, re-read at once when ``offset`` lies below it (:meth:`LogStartCache.log_start_for`)."""
        return self._starts.log_start_for(offset)

    def deleted(self, slot: int, *, max_staleness_s: float | None = None) -> bool:
        """Whether a missing ``slot`` was removed by retention (:meth:`MissingSlots.deleted`)."""
        return self._missing.deleted(slot, max_staleness_s=max_staleness_s)

    def open_listings(self, *more: Callable[[], object]) -> None:
        """A reader's open in one round (PROTOCOL.md "Reading" "Opening"): LIST ``start/`` (and the newest
        marker's GET, after retention), ``segments/`` and ``log/`` together, with ``more`` (the caller's own
        listings, single requests) beside them. The listing of ``log/`` is a hint (:meth:`listed_end`)."""
        tasks: list[Callable[[], object]] = [self._starts.reread, self.segments.refresh, self._tail.list_loose]
        parallel_map(lambda task: task(), [*tasks, *more], leaf=True)

    # --- tail: txn_core.partition.tail ----------------------------------------------------------

    def listed_end(self) -> int | None:
        """The slot past the last loose entry a recent listing showed (:meth:`TailSearch.listed_end`), or past
        the last listed segment when that ends later and its end is known (opened: no request): a hint of
        how many slots a reader may read at once, never of where the log ends."""
        listed = self._tail.listed_end()
        if listed is None:
            return None
        chain = self.segments.known_chain_end()
        return listed if chain is None else max(listed, chain)

    def known_tail_slot(self) -> int | None:
        """The first free slot as this process last learned it (no request; None if it never did)."""
        return self._index.known_tail_slot()

    def tail(self, refresh: bool = False) -> tuple[int, int]:
        """``(next slot, next offset)``: the first free slot and the log end offset (:meth:`TailSearch.tail`)."""
        return self._tail.tail(refresh)

    def end_offset(self) -> int:
        """The log end offset (next offset to be assigned), following new entries. Raises
        :class:`DamagedEntryError` when the last entry is damaged and not marked lost."""
        return self.tail()[1]

    def readable_tail(self, refresh: bool = False) -> tuple[int, int]:
        """``(slot, offset)`` where reading stops now (:meth:`TailSearch.readable_tail`)."""
        return self._tail.readable_tail(refresh)

    def readable_end(self) -> int:
        """The offset where reading stops now (see :meth:`readable_tail`): what readers call the end."""
        return self.readable_tail()[1]

    def free_slot(self, lower: int) -> int:
        """The first free slot at or above ``lower`` that no entry follows (:meth:`TailSearch.free_slot`)."""
        return self._tail.free_slot(lower)

    def scan_bounds(self) -> tuple[LogStart, int, int]:
        """``(log start, loose floor, end)`` for a scan of the whole partition, from a fresh log start and
        segment listing: entries are slots ``[start.slot, end)``; below the loose floor (the segments' chain
        end) they are read from segments, from it on as loose objects; ``end`` is the first free slot past
        every entry and hole. A scan that looked for loose objects from the log start of a rolled partition
        would take the first rolled slot for the end, and miss every entry after it."""
        with self._index.lock:
            start, floor = self._tail.loose_floor(refresh=True)
        return start, floor, self.free_slot(floor)

    def boundary_before(self, slot: int) -> tuple[int, int]:
        """``(first offset, timestamp)`` the entry before ``slot`` gives the entry at ``slot``: where its
        offsets begin, and the previous entry's time (the log start's offset and 0 for the first entry)."""
        start = self.log_start()
        if slot <= start.slot:
            return start.offset, 0
        header = self.read_header(slot - 1)
        return header.next_offset, header.timestamp_ms

    # --- append: txn_core.partition.appender ----------------------------------------------------

    def append(
        self,
        kind: EntryKind,
        payload: Sequence[bytes | memoryview] | bytes,
        payload_len: int,
        payload_crc: int,
        record_count: int,
        *,
        producer_id: int = -1,
        producer_epoch: int = 0,
        base_sequence: int = -1,
        txn: TxnId | None = None,
        timestamp_ms: int | None = None,
        writer_id: bytes | None = None,
        gate: Callable[[], bool] | None = None,
        carried: CarriedMarker | None = None,
    ) -> AppendResult:
        """Append one entry; returns where it landed. Safe against any number of concurrent appenders.

        ``writer_id`` identifies this logical append across retries (a fresh one when omitted). A caller
        retrying after an :class:`UnknownOutcomeError` passes the same writer id and gets the same slot.
        ``gate``: the entry becomes visible only once it returns True (:meth:`Storage.create_gated`; a
        backend that stages creates writes the bytes meanwhile); if it returns False nothing is appended
        and :class:`~txn_core.storage.base.GateClosedError` is raised. ``carried``: the marker a data entry
        carries (PROTOCOL.md "Carried markers").
        """
        if kind is EntryKind.LOST:
            raise ConfigurationError('an entry of kind LOST is never written (PROTOCOL.md "Damage")')
        if carried is not None and kind not in (EntryKind.DATA, EntryKind.DATA_REF):
            raise ConfigurationError(f'a {kind.name} entry carries no marker (PROTOCOL.md "Carried markers")')
        chunks = [payload] if isinstance(payload, bytes | memoryview) else list(payload)
        wid = writer_id or uuid.uuid4().bytes
        ts = self.clock() if timestamp_ms is None else timestamp_ms
        template = EntryHeader(
            kind,
            0,
            record_count,
            producer_id,
            producer_epoch,
            base_sequence,
            txn,
            ts,
            payload_len,
            payload_crc,
            wid,
            carried,
        )
        return self._appender.append(template, chunks, gate)

    def append_payload(
        self,
        kind: EntryKind,
        payload: Payload,
        record_count: int,
        *,
        producer_id: int = -1,
        producer_epoch: int = 0,
        base_sequence: int = -1,
        txn: TxnId | None = None,
        writer_id: bytes | None = None,
        gate: Callable[[], bool] | None = None,
        carried: CarriedMarker | None = None,
    ) -> AppendResult:
        """:meth:`append` of a :class:`~txn_core.format.entry.Payload` (its chunks, length and checksum)."""
        return self.append(
            kind,
            payload.chunks,
            payload.length,
            payload.crc,
            record_count,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=base_sequence,
            txn=txn,
            writer_id=writer_id,
            gate=gate,
            carried=carried,
        )

    # --- read: txn_core.partition.fetch ---------------------------------------------------------

    def read_header(self, slot: int) -> EntryHeader:
        """:meth:`fetch_header`, remembered (:meth:`remember`)."""
        return self._fetcher.read_header(slot)

    def read_entry(self, slot: int) -> Entry:
        """Read a whole entry (header verified; payload verified lazily by :meth:`Entry.payload`), remembered."""
        return self._fetcher.read_entry(slot)

    def fetch_header(self, slot: int) -> EntryHeader:
        """The verified header of ``slot``, or the LOST header of an entry marked lost; no effect on the
        caches, so it may run on any thread (:meth:`EntryFetcher.fetch_header`)."""
        return self._fetcher.fetch_header(slot)

    def fetch_headers(self, slot: int, count: int) -> list[EntryHeader]:
        """Headers from ``slot`` on (:meth:`EntryFetcher.fetch_headers`)."""
        return self._fetcher.fetch_headers(slot, count)

    def fetch_entry(self, slot: int) -> Entry:
        """The whole entry at ``slot`` in one request (:meth:`EntryFetcher.fetch_entry`)."""
        return self._fetcher.fetch_entry(slot)

    def fetch_entries(self, slot: int, count: int, max_bytes: int) -> list[Entry] | EntrySpan:
        """Entries from ``slot`` on (:meth:`EntryFetcher.fetch_entries`)."""
        return self._fetcher.fetch_entries(slot, count, max_bytes)

    def rolled_entry(self, slot: int) -> Entry | None:
        """``slot``'s entry from a segment, after a fresh listing (:meth:`EntryFetcher.rolled_entry`)."""
        return self._fetcher.rolled_entry(slot)

    def lost_entry(self, slot: int) -> LostEntry | None:
        """The lost-entry record of ``slot``, if an operator marked it lost (one GET; remembered)."""
        return self._fetcher.lost_entry(slot)

    def damaged(self, slot: int, exc: CorruptDataError, header: EntryHeader | None = None) -> DamagedEntryError:
        """The error for the damaged entry at ``slot`` (:meth:`EntryFetcher.damaged`)."""
        return self._fetcher.damaged(slot, exc, header)

    def missing_check(self, slot: int) -> CorruptDataError:
        """The check a hole at ``slot`` fails (see :meth:`is_hole`)."""
        return self._missing.missing_check(slot)

    def is_hole(self, slot: int) -> bool:
        """Whether ``slot``, found missing, is a hole, asked with a fresh segment listing and log start
        (:meth:`MissingSlots.is_hole`)."""
        return self._missing.is_hole(slot)

    # --- offset -> slot: txn_core.partition.index -----------------------------------------------

    def remember(self, slot: int, header: EntryHeader) -> None:
        """Learn from a header read at ``slot``: where its offsets are, and the tail if it lies past it.
        Call on the thread that owns this object's use (not thread-safe against itself)."""
        self._index.remember(slot, header)

    def slot_for_offset(self, offset: int) -> int:
        """The slot of the entry containing ``offset`` (or the tail slot when ``offset`` is the end)
        (:meth:`OffsetSearch.slot_for_offset`)."""
        return self._offsets.slot_for_offset(offset)

    def known_stop_slot(self, offset: int) -> int | None:
        """The first slot whose entry begins at or after ``offset``, if known without a request."""
        return self._offsets.known_stop_slot(offset)

    def entry_span(self, offset: int) -> tuple[int, int, int]:
        """``(slot, base offset, next offset)`` of the entry containing ``offset`` (below the readable end)
        (:meth:`OffsetSearch.entry_span`)."""
        return self._offsets.entry_span(offset)
