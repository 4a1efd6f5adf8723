"""One partition log: entries in a slot log, with dense record offsets (PROTOCOL.md "Partition log").

Entry ``n`` lives at ``<path>/log/<020d n>``. Its header carries its ``base_offset``; entry ``n+1``'s base
offset is entry ``n``'s ``base_offset + record_count``, so offsets are dense and never collide.

Append (any number of processes at once):

1. Know the tail ``(slot, next_offset)``: cached from this process's last append or read, else found by
   :meth:`SlotLog.find_tail` above the log start.
2. ``create_resolving`` the entry at ``slot`` with ``base_offset = next_offset``.
3. Lost the race: read the winner's header, advance to ``(slot + 1, winner.next_offset)``, go to 2 with
   the same payload and writer id. An unknown outcome is resolved by reading the slot back.

A second append of this process while one is in flight claims the slot after it and starts its create at
once, visible only after the first landed (:mod:`txn_core.partition.appendchain`); if the first did not land, it
claims again at step 1.

Crash windows: a crash before the create leaves nothing; the create is atomic, so a crash during it
leaves either the whole entry or nothing (on local disk without ``O_TMPFILE``, possibly a ``.tmp-*`` file nobody
lists).

Damage (PROTOCOL.md "Damage"): an entry that fails its checks on two reads in a row is damaged. Reading it
gives the header made up from its lost-entry record when an operator marked it lost, else raises
:class:`DamagedEntryError`; a damaged entry inside the log does not hide the entries after it from the tail
search, and a damaged *last* entry makes the log end unknown, so appends fail until it is marked lost. A
*hole* (a loose slot missing while the next one exists) is damage too, never the log end: the tail search
goes on past it, and a read that misses it with a later entry known raises as for any damaged entry.

Slots rolled into segments (PROTOCOL.md "Segments") are read from them: :attr:`PartitionLog.segments`
answers for the slots a segment holds, and a missing loose slot is re-checked against a fresh segment
listing before it is reported missing. The tail search starts above the chain end of the segments.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from sortedcontainers import SortedDict

from txn_core.clock import Clock, monotonic
from txn_core.errors import (
    ConfigurationError,
    CorruptDataError,
    DamagedEntryError,
    ObjectExistsError,
    ObjectNotFoundError,
    OffsetOutOfRangeError,
)
from txn_core.format import envelope, paths
from txn_core.format.entry import HEADER_SIZE, EntryHeader, EntryKind, Payload, decode_header, verify_payload
from txn_core.format.ids import TxnId
from txn_core.format.segment import Inlined
from txn_core.format.slotlog import SlotLog
from txn_core.partition.appendchain import ChainGate, Claim
from txn_core.partition.lost import LostEntry, damaged_entry_error, read_lost
from txn_core.partition.segments import SegmentCatalog, SegmentEntry
from txn_core.storage.base import GateClosedError, Storage, create_resolving
from txn_core.storage.parallel import parallel_map, submit

T = TypeVar("T")

#: The check a hole fails (PROTOCOL.md "Damage"): what readers, ``damaged`` and ``inspect`` report for it.
MISSING_CHECK = "missing: the object is gone although later entries exist"

#: Distances past a free slot probed, all at once, before it is taken for the tail: an entry present at any
#: of them makes the free slot a hole, not the tail. Every distance up to 8 (a run of up to 7 missing slots
#: with any entry after it), then sparser (a wider run, in a log that goes on past it).
HOLE_PROBES = (1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64)
#: The same for a reader polling at what it takes for the log end (beside its periodic listing) and for an
#: appender that lost a create race (beside the winner's header read): few, as they are paid often.
HOLE_PROBES_CHEAP = (1, 2)
#: Header reads in flight together in each round of the search for an offset's slot.
SEARCH_PROBES = 8
#: A cached tail older than this is re-checked before appending (see PROTOCOL.md "Retention").
TAIL_RECHECK_S = 60.0
#: Entries whose slot a process remembers per partition (a cache: a lookup it misses bisects headers).
#: Bounds the memory of a long-lived reader or writer, whatever the partition's length.
INDEX_MAX_ENTRIES = 65_536
#: A cached log start is re-read (one LIST) when older than this. Until then a slot deleted by retention
#: that this process never saw exist reads as the log end: planning and polling see no new data for up to
#: this long after retention removed unread entries; they never see a wrong offset or lost row.
LOG_START_RECHECK_S = 5.0


@dataclass(frozen=True, slots=True)
class AppendResult:
    slot: int
    base_offset: int
    record_count: int
    timestamp_ms: int

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.record_count


@dataclass(frozen=True, slots=True)
class LogStart:
    """The first slot and offset still present (retention moves it forward)."""

    slot: int
    offset: int
    #: bytes of all entries below the start (removed by retention so far)
    bytes_before: int = 0


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


class PartitionLog:
    """Append to and read one partition log. Thread-safe; one instance per (process, log path)."""

    def __init__(self, storage: Storage, path: str, *, clock: Clock) -> None:
        self.storage = storage
        self.path = path
        self.clock: Clock = clock
        self.monotonic = monotonic(clock)  # the clock's monotonic seconds: cache ages (txn_core.clock)
        self.entries = SlotLog(storage, paths.entries(path))
        self.segments = SegmentCatalog(storage, path, monotonic=self.monotonic)
        self._lock = threading.Lock()
        self._tail: tuple[int, int] | None = None  # (next slot, next offset)
        self._tail_checked = 0.0
        self._chain: Claim | None = None  # this process's last append in flight (txn_core.partition.appendchain)
        self._start: LogStart | None = None
        self._start_checked = 0.0
        self._index: SortedDict = SortedDict()  # base_offset -> (slot, record_count); see _note
        self._lost: dict[int, LostEntry] = {}  # lost-entry records read (immutable once they exist)
        self._missing_since: tuple[int, float] | None = None  # (slot, when): a reader kept missing it since
        self._holes: set[int] = set()  # slots found to be holes: a later miss there asks again at once

    def __getstate__(self) -> dict[str, object]:
        return {"storage": self.storage, "path": self.path}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(state["storage"], state["path"])  # type: ignore[misc]

    # --- log start (retention) ------------------------------------------------------------------

    def log_start(self, refresh: bool = False) -> LogStart:
        """The log start: the newest ``<path>/start/<slot>`` marker, else slot 0 / offset 0."""
        if self._start is None:
            self.segments.start_listing()  # a first use: the segment listing overlaps the log start's
        if self._start is None or refresh:
            names = [n for n in self.storage.list(paths.log_start(self.path)) if not n.endswith("/")]
            start = LogStart(0, 0)
            for name in reversed(names):
                key = paths.log_start(self.path) + name
                try:
                    value = envelope.read_json(self.storage, key, envelope.ObjectKind.LOG_START)
                except ObjectNotFoundError:
                    continue
                start = LogStart(int(value["slot"]), int(value["offset"]), int(value.get("bytes_before", 0)))
                break
            self._start = start
            self._start_checked = self.monotonic()
        return self._start

    def deleted(self, slot: int, *, max_staleness_s: float | None = None) -> bool:
        """Whether a missing ``slot`` was removed by retention (it lies below the published log start).

        Re-reads the log start at most every ``max_staleness_s`` seconds (default
        :data:`LOG_START_RECHECK_S`), so polling the tail stays at
        one request per poll.
        """
        if slot < self.recent_log_start(max_staleness_s).slot:
            return True
        tail = self._tail
        if tail is not None and slot < tail[0]:
            # A slot below one already seen to exist cannot be the log end: it was deleted, whatever
            # the cached log start says. Re-read the start to confirm.
            return slot < self.log_start(refresh=True).slot
        return False

    def recent_log_start(self, max_staleness_s: float | None = None) -> LogStart:
        """The log start, re-read (one LIST) when the cached value is older than ``max_staleness_s``
        (default :data:`LOG_START_RECHECK_S`)."""
        if max_staleness_s is None:
            max_staleness_s = LOG_START_RECHECK_S
        now = self.monotonic()
        if self._start is None or now - self._start_checked >= max_staleness_s:
            self.log_start(refresh=True)
        return self.log_start()

    def log_start_for(self, offset: int) -> LogStart:
        """The recent log start (:meth:`recent_log_start`), re-read at once when ``offset`` lies below it:
        an offset is reported removed by retention only against a fresh log start."""
        start = self.recent_log_start()
        if offset < start.offset:
            start = self.log_start(refresh=True)
        return start

    # --- tail -----------------------------------------------------------------------------------

    def known_tail_slot(self) -> int | None:
        """The first free slot as this process last learned it (no request; None if it never did)."""
        with self._lock:
            return self._tail[0] if self._tail is not None else None

    def tail(self, refresh: bool = False) -> tuple[int, int]:
        """``(next slot, next offset)``: the first free slot and the log end offset."""
        with self._lock:
            return self._advance_tail_locked(*self._tail_locked(refresh))

    def _tail_locked(self, refresh: bool) -> tuple[int, int]:
        """The cached tail (no request), re-checked after TAIL_RECHECK_S, else discovered."""
        now = self.monotonic()
        if self._tail is not None and not refresh:
            if now - self._tail_checked < TAIL_RECHECK_S:
                return self._tail
            slot = self._tail[0]
            if slot == self.log_start().slot or self.entries.exists(slot - 1):
                self._tail_checked = now
                return self._tail
            # The cached tail's predecessor vanished (retention ran, or it was rolled): rediscover.
        start, lower = self._loose_floor(refresh=self._tail is not None)
        # The probes for holes past each candidate overlap the read of the header before it.
        _, tail = self._free_slot_past_holes(
            lower, lambda slot: (slot, start.offset) if slot == start.slot else self._after_last_readable(slot, start)
        )
        self._tail, self._tail_checked = tail, now
        return tail

    def _loose_floor(self, refresh: bool) -> tuple[LogStart, int]:
        """The log start, and the slot from which loose entries form a gap-free run up to the tail: the log
        start or the segments' chain end, whichever is higher (PROTOCOL.md "Segments", "Appenders"). The
        segment listing is always re-read (an appender that took a rolled slot for the log end would write
        into history), together with the log start when ``refresh``."""
        self.segments.refresh(lambda: self.log_start(refresh=True) if refresh or self._start is None else None)
        start = self.log_start()
        chain = self.segments.chain_end()
        return start, max(start.slot, chain if chain is not None else start.slot)

    def _after_last_readable(self, slot: int, start: LogStart) -> tuple[int, int]:
        """``(s, next offset)`` for the highest ``s <= slot`` whose previous entry is readable (or the log
        start): the entries before ``slot`` normally (one read); short of a damaged run at the end, which
        :meth:`_advance_tail_locked` then meets, or an append at ``s`` collides with.

        A run may hold missing slots: below a present (damaged) slot, a miss is a hole, not the end. If the
        run begins with one, nothing would collide with an append there (its offsets would be reused by
        the entries after it): the hole's :class:`DamagedEntryError` is raised instead, with its first
        offset, so appends refuse and readers stop at it (:meth:`readable_tail`)."""
        s = slot
        holes: dict[int, DamagedEntryError] = {}
        asked: set[int] = set()
        while s > start.slot:
            try:
                offset = self.read_header(s - 1).next_offset
            except DamagedEntryError as exc:
                if exc.check == MISSING_CHECK:
                    holes[s - 1] = exc
                s -= 1
                continue
            except ObjectNotFoundError:
                # Slot ``s`` is present (the search found it, or it was read damaged): a miss below it is a
                # hole once a fresh look says so (a miss read with a stale segment listing is raised as one).
                if s == slot or s - 1 in asked or not self.is_hole(s - 1):
                    raise
                asked.add(s - 1)
                continue  # read it again: now a hole (damage), or its lost record
            return self._unless_hole(holes, s, offset)
        return self._unless_hole(holes, start.slot, start.offset)

    @staticmethod
    def _unless_hole(holes: dict[int, DamagedEntryError], slot: int, offset: int) -> tuple[int, int]:
        """``(slot, offset)`` as the tail, unless ``slot`` is a hole: then its damage, with ``offset`` as its
        first offset (an append there would collide with nothing)."""
        hole = holes.get(slot)
        if hole is not None:
            hole.first_offset = offset
            raise hole
        return slot, offset

    def _advance_tail_locked(self, slot: int, offset: int) -> tuple[int, int]:
        """Follow slots created by others since the cached tail (one GET per new slot). A damaged entry
        with entries after it is stepped over; a damaged last entry raises :class:`DamagedEntryError`
        with its ``first_offset``: nobody knows where its offsets end."""
        damaged: DamagedEntryError | None = None  # the first of a run of damaged entries
        while True:
            try:
                header = self.read_header(slot)
            except ObjectNotFoundError:
                if damaged is not None:  # only retention deletes entries: the run is the end after all
                    raise damaged from None
                break
            except DamagedEntryError as exc:
                if damaged is None:
                    exc.first_offset, damaged = offset, exc
                if not self.entries.exists(slot + 1):
                    self._tail = (damaged.slot, offset)  # appends after it fail; readers stop at it
                    raise damaged from None
                slot += 1
                continue
            damaged = None
            slot, offset = slot + 1, header.next_offset
        self._tail = (slot, offset)
        return self._tail

    def end_offset(self) -> int:
        """The log end offset (next offset to be assigned), following new entries. Raises
        :class:`DamagedEntryError` when the last entry is damaged and not marked lost."""
        return self.tail()[1]

    def readable_tail(self, refresh: bool = False) -> tuple[int, int]:
        """``(slot, offset)`` where reading stops now: the tail, or, when the last entry is damaged and
        not marked lost, that entry's slot and first offset (nothing after it exists yet)."""
        try:
            return self.tail(refresh)
        except DamagedEntryError as exc:
            if exc.first_offset is None:
                raise
            return exc.slot, exc.first_offset

    def readable_end(self) -> int:
        """The offset where reading stops now (see :meth:`readable_tail`): what readers call the end."""
        return self.readable_tail()[1]

    def boundary_before(self, slot: int) -> tuple[int, int]:
        """``(first offset, timestamp)`` the entry before ``slot`` gives the entry at ``slot``: where its
        offsets begin, and the previous entry's time (the log start's offset and 0 for the first entry)."""
        start = self.log_start()
        if slot <= start.slot:
            return start.offset, 0
        header = self.read_header(slot - 1)
        return header.next_offset, header.timestamp_ms

    # --- append ---------------------------------------------------------------------------------

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
    ) -> AppendResult:
        """Append one entry; returns where it landed. Safe against any number of concurrent appenders.

        ``writer_id`` identifies this logical append across retries (a fresh one when omitted). A caller
        retrying after an :class:`UnknownOutcomeError` passes the same writer id and gets the same slot.
        ``gate``: the entry becomes visible only once it returns True (:meth:`Storage.create_gated`; a
        backend that stages creates writes the bytes meanwhile); if it returns False nothing is appended
        and :class:`~txn_core.storage.base.GateClosedError` is raised.
        """
        if kind is EntryKind.LOST:
            raise ConfigurationError('an entry of kind LOST is never written (PROTOCOL.md "Damage")')
        chunks = [payload] if isinstance(payload, bytes | memoryview) else list(payload)
        wid = writer_id or uuid.uuid4().bytes
        ts = self.clock() if timestamp_ms is None else timestamp_ms
        template = EntryHeader(
            kind, 0, record_count, producer_id, producer_epoch, base_sequence, txn, ts, payload_len, payload_crc, wid
        )
        while True:
            with self._lock:
                # Behind this process's append in flight, if any (txn_core.partition.appendchain), else at the tail.
                prev = self._chain
                slot, offset = (prev.slot + 1, prev.next_offset) if prev is not None else self._tail_locked(False)
                header = template.with_base_offset(offset).encode()  # may raise: before anything is claimed
                claim = self._chain = Claim(slot, offset + record_count)
            try:
                chain_gate = ChainGate(prev, gate)
                try:
                    create_resolving(
                        self.storage,
                        self.entries.key(slot),
                        [header, *chunks],
                        header,
                        gate=chain_gate if prev is not None or gate is not None else None,
                    )
                except GateClosedError:
                    self._settle(claim, False)
                    if chain_gate.prev_failed:
                        continue  # the append ahead did not land: claim again
                    raise
                except ObjectExistsError:
                    if chain_gate.opened:
                        gate = None  # it opened: the data may be visible from now on
                    with self._lock:
                        self._settle_locked(claim, False)
                        ours = self._after_lost_race_locked(slot, wid)
                    if ours is not None:
                        return AppendResult(slot, ours.base_offset, record_count, ts)
                    continue
                with self._lock:
                    self._advance_to(slot + 1, offset + record_count)
                    self._tail_checked = self.monotonic()
                    self._note(offset, slot, record_count)
                    self._settle_locked(claim, True)
                return AppendResult(slot, offset, record_count, ts)
            finally:
                if not claim.settled:
                    # An error or an interrupt anywhere above (a crash, a failed create, Ctrl-C): appends claimed
                    # behind this one must not wait for ever; they claim again.
                    self._settle(claim, False)

    def _settle(self, claim: Claim, landed: bool) -> None:
        with self._lock:
            self._settle_locked(claim, landed)

    def _settle_locked(self, claim: Claim, landed: bool) -> None:
        """Settle ``claim``. The next append claims from the tail when it was the last of the chain, or when it
        failed: whatever was claimed behind it fails too and claims again. (A failure can so end the chain while
        a newer claim is in flight; the next append then asks the tail, which does not include that claim, and
        may try its slot: the create lets one of them win, as between processes, and the loser moves on.)"""
        if self._chain is claim or not landed:
            self._chain = None
        claim.settle(landed)

    def _after_lost_race_locked(self, slot: int, wid: bytes) -> EntryHeader | None:
        """Another entry is at ``slot``: the winner's header when it is this append's own earlier attempt
        (resolved on a later round); else None, with the tail moved past the winner (and past a hole after it,
        which is never filled)."""
        # Beside the winner's header: is the next slot free, and is anything present past it?
        nxt = self._probe_after(slot, (1, *(1 + d for d in HOLE_PROBES_CHEAP)), {})
        winner = self.read_header(slot)
        if winner.writer_id == wid:
            self._advance_to(slot + 1, winner.next_offset)
            return winner
        self._remember(slot, winner)
        slot, offset = slot + 1, winner.next_offset
        later = [p for p, f in nxt[1:] if f.result()]
        if later and not nxt[0][1].result() and not self.entries.exists(slot):
            # The next slot is missing while a later one is present (asked again after that one was seen: no
            # racing append explains it): a hole. Never fill it: go on past it.
            slot = self.free_slot(max(later))
            offset = self.read_header(slot - 1).next_offset
        self._advance_to(slot, offset)
        return None

    def _advance_to(self, slot: int, offset: int) -> None:
        """Move the cached tail up to ``(slot, offset)``; a tail already past it (a reader saw more) stays."""
        if self._tail is None or self._tail[0] < slot:
            self._tail = (slot, offset)

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
        )

    # --- read -----------------------------------------------------------------------------------

    def read_header(self, slot: int) -> EntryHeader:
        header = self.fetch_header(slot)
        self.remember(slot, header)
        return header

    def read_entry(self, slot: int) -> Entry:
        """Read a whole entry (header verified; payload verified lazily by :meth:`Entry.payload`)."""
        entry = self.fetch_entry(slot)
        self.remember(slot, entry.header)
        return entry

    def fetch_header(self, slot: int) -> EntryHeader:
        """The verified header of ``slot`` (one ranged read, or a segment's index), or the LOST header of an
        entry marked lost; :class:`DamagedEntryError` for a damaged entry not marked lost. Damage is
        confirmed by a second read (a read can be corrupted on its way). No effect on this object's caches
        but the lost-entry records it reads, so it may run on any thread (:mod:`txn_core.partition.readahead`)."""
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

    def fetch_entries(self, slot: int, count: int, max_bytes: int) -> list[Entry]:
        """Entries from ``slot`` on: up to ``count`` (and about ``max_bytes``) from the segment holding
        ``slot`` in one ranged read, else the loose entry alone (see :meth:`fetch_entry`)."""
        got = self.segments.read(slot, count, max_bytes)
        if got:
            return [_segment_entry(item) for item in got]
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
        missing is looked up once more in the segments after :meth:`_relist_after_miss` (it may have been
        rolled and deleted since the listing was taken) before the miss is raised. A miss that is a hole
        (:meth:`_hole`) is damage: ``marked(record)`` when the slot was marked lost, else
        :class:`DamagedEntryError`."""
        got = rolled(slot)
        if got is not None:
            return got
        try:
            return loose(slot)
        except ObjectNotFoundError:
            later = self._relist_after_miss(slot)
            got = rolled(slot)
            if got is not None:
                return got
            if not later:
                raise
        self._recheck_for_hole()
        got = rolled(slot)
        if got is not None:
            return got
        if not self._hole(slot):
            raise ObjectNotFoundError(f"{self.entries.key(slot)} not found", self.entries.key(slot))
        return marked(self._lost_or_raise(slot, self.missing_check(slot)))

    def missing_check(self, slot: int) -> CorruptDataError:
        """The check a hole at ``slot`` fails (see :meth:`is_hole`)."""
        key = self.entries.key(slot)
        return CorruptDataError(f"{key}: {MISSING_CHECK}", key, MISSING_CHECK)

    def is_hole(self, slot: int) -> bool:
        """Whether ``slot``, found missing, is a hole (:meth:`_hole`), asked with a fresh segment listing and
        log start (a few requests: for callers that already know the slot lies inside the log)."""
        self._recheck_for_hole()
        return self.segments.header(slot) is None and self._hole(slot)

    def scan_bounds(self) -> tuple[LogStart, int, int]:
        """``(log start, loose floor, end)`` for a scan of the whole partition, from a fresh log start and
        segment listing: entries are slots ``[start.slot, end)``; below the loose floor (the segments' chain
        end) they are read from segments, from it on as loose objects; ``end`` is the first free slot past
        every entry and hole. A scan that looked for loose objects from the log start of a rolled partition
        would take the first rolled slot for the end, and miss every entry after it."""
        with self._lock:
            start, floor = self._loose_floor(refresh=True)
        return start, floor, self.free_slot(floor)

    def free_slot(self, lower: int) -> int:
        """The first free slot at or above ``lower`` that no entry follows (see :meth:`_free_slot_past_holes`)."""
        return self._free_slot_past_holes(lower, lambda slot: None)[0]

    def _free_slot_past_holes(self, lower: int, beside: Callable[[int], T]) -> tuple[int, T]:
        """The first free slot at or above ``lower`` that no entry follows, and ``beside`` of it.

        :meth:`SlotLog.find_tail` gives the first free slot; it is the tail only if no slot shortly after it
        (:data:`HOLE_PROBES`) is present: a missing slot below a present one is a hole (PROTOCOL.md "Damage"),
        and an append there would reuse the offsets of the entries after it. Past a hole (or past racing
        appends) the search goes on. ``beside(candidate)`` runs while the probes past it are in flight."""
        seen: dict[int, bool] = {}
        slot = self.entries.find_tail(lower, seen=seen)
        while True:
            later = self._probe_after(slot, HOLE_PROBES, seen)
            try:
                got = beside(slot)
            except CorruptDataError:  # damage before the candidate: raised only at the end (else the search goes on)
                if not any(f.result() for _, f in later):
                    raise
            else:
                if not any(f.result() for _, f in later):
                    return slot, got
            found = [p for p, f in later if f.result()]
            seen.clear()
            slot = self.entries.find_tail(max(found), seen=seen)

    def _probe_after(
        self, slot: int, distances: Sequence[int], seen: dict[int, bool]
    ) -> list[tuple[int, Future[bool]]]:
        """Whether each slot ``slot + d`` exists, as futures running on the leaf pool (answered at once for the
        slots in ``seen``)."""
        out = []
        for d in distances:
            probe = slot + d
            if probe in seen:
                done: Future[bool] = Future()
                done.set_result(seen[probe])
                out.append((probe, done))
            else:
                out.append((probe, submit(self.entries.exists, probe, leaf=True)))
        return out

    def _relist_after_miss(self, slot: int) -> bool:
        """After ``slot`` was missing as a loose object: re-list the segments if there is no listing yet, it
        is older than LOG_START_RECHECK_S, or ``slot`` lies below a slot known to exist. A log start as old
        is re-read at the same time (the caller's next question is whether retention removed the slot), so
        a reader polling the log end pays one round trip per LOG_START_RECHECK_S for both. Returns whether
        an entry after ``slot`` is known to exist: the cached tail lies past it, or, when the listing was
        stale, probes of the next slots (:meth:`_hole_probes_at`) made beside the listing found one: a reader
        stopped at a hole learns of it within LOG_START_RECHECK_S (two missing slots or fewer) or
        TAIL_RECHECK_S (a longer run), at two more requests each time, not one more round trip."""
        tail = self._tail
        known = tail is not None and slot + 1 < tail[0]
        stale = not self.segments.listed_within(LOG_START_RECHECK_S)
        probes = self._probe_after(slot, self._hole_probes_at(slot), {}) if stale and not known else []
        if stale or (tail is not None and slot < tail[0]):
            self.segments.refresh(self.recent_log_start)
        return known or slot in self._holes or self.segments.starts_after(slot) or any(f.result() for _, f in probes)

    def _hole_probes_at(self, slot: int) -> Sequence[int]:
        """The distances a reader missing ``slot`` probes past it: HOLE_PROBES_CHEAP, and all of HOLE_PROBES once
        every TAIL_RECHECK_S while it keeps missing the same slot (a run of several missing slots)."""
        now = self.monotonic()
        since = self._missing_since
        if since is None or since[0] != slot:
            self._missing_since = (slot, now)
            return HOLE_PROBES_CHEAP
        if now - since[1] < TAIL_RECHECK_S:
            return HOLE_PROBES_CHEAP
        self._missing_since = (slot, now)
        return HOLE_PROBES

    def _recheck_for_hole(self) -> None:
        """Re-list the segments with a listing started after a miss (a listing shared with a reader whose
        listing began earlier could predate a roll), then re-read the log start, before a miss is called a
        hole (two round trips, on that rare path only)."""
        self.segments.refresh()
        self.segments.refresh()
        self.log_start(refresh=True)  # after the listing: a segment retention deleted is past this start

    def _hole(self, slot: int) -> bool:
        """Whether the missing loose ``slot`` is a hole: missing still, with a slot shortly after it present
        (HOLE_PROBES) or a segment starting after it (the later entries may all be rolled, their loose
        objects deleted), and neither removed by retention (the log start lies at or below it) nor rolled
        (the caller asked the fresh segment listing). A hole arises only when an object is deleted by hand or
        lost by the store: slot ``n + 1`` is created only by a writer that read slot ``n`` (PROTOCOL.md
        "Damage")."""
        if slot < self.log_start().slot:
            return False
        if self.segments.starts_after(slot):
            # Read after the caller's segment lookup: had retention removed the segment holding the slot
            # since the listing, it published this log start first.
            hole = slot >= self.log_start(refresh=True).slot and not self.entries.exists(slot)
        else:
            later = any(f.result() for _, f in self._probe_after(slot, HOLE_PROBES, {}))
            hole = later and not self.entries.exists(slot)  # asked after a later slot was seen (a racing append)
        if hole:  # a later miss there is damage at once, not the log end until the next look (5 s)
            self._holes.add(slot)
        return hole

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
        return Entry(slot, header, data, key, source=self)

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

    def remember(self, slot: int, header: EntryHeader) -> None:
        """Learn from a header read at ``slot``: where its offsets are, and the tail if it lies past it.
        Call on the thread that owns this object's use (not thread-safe against itself)."""
        self._remember(slot, header)

    def _note(self, base_offset: int, slot: int, record_count: int) -> None:
        """Remember where an entry is; past :data:`INDEX_MAX_ENTRIES`, forget the older half."""
        index = self._index
        index[base_offset] = (slot, record_count)
        if len(index) > INDEX_MAX_ENTRIES:
            for key in list(index.islice(0, len(index) // 2)):
                index.pop(key, None)

    def _remember(self, slot: int, header: EntryHeader) -> None:
        self._note(header.base_offset, slot, header.record_count)
        tail = self._tail
        if tail is not None and slot >= tail[0]:
            # A reader saw entries past the cached tail: follow them (a stale cache would only cost a
            # lost create race or extra reads, never a wrong offset).
            self._tail = (slot + 1, header.next_offset)

    def slot_for_offset(self, offset: int) -> int:
        """The slot of the entry containing ``offset`` (or the tail slot when ``offset`` is the end).

        Costs no request when the answer is known: the log start's offset, where every read from the
        earliest offset begins, is at the log start's slot, and remembered entries and opened segments
        know theirs (their offsets lie below the end, so the tail is not needed to check them). Otherwise
        the tail bounds ``offset`` and the slots are searched in rounds of :data:`SEARCH_PROBES` header reads
        in flight together, interpolated and spread: one round for entries of like size, at most about
        ``log8(n)`` rounds whatever their sizes (a bisection read ``log2(n)`` headers one after another).
        """
        start = self.log_start()
        if offset == start.offset:
            return start.slot  # the first entry present begins here (in an empty log, it is the tail)
        if offset > start.offset:
            rolled = self.segments.slot_for_offset(offset)
            if rolled is not None:
                return rolled
            known = self._remembered(offset)
            if known is not None and offset < known[2]:
                return known[0]
        tail_slot, end = self.readable_tail()
        if offset < start.offset or offset > end:
            raise OffsetOutOfRangeError(f"offset {offset} is outside {self.path}'s range [{start.offset}, {end}]")
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
                    self._remember(slot, header)
                if base <= offset:
                    if slot > lo:
                        lo, lo_base = slot, base
                elif slot - 1 < hi:
                    hi, hi_next = slot - 1, base
        return lo

    def known_stop_slot(self, offset: int) -> int | None:
        """The first slot whose entry begins at or after ``offset``, if known without a request: the tail's
        slot at the end this process last learned, else a remembered entry's or an opened segment's."""
        with self._lock:
            tail = self._tail
        if tail is not None and offset == tail[1]:
            return tail[0]
        known = self._remembered(offset)
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
        known = self._remembered(offset)
        if known is not None and known[0] == slot and offset < known[2]:
            return known
        header = self.fetch_header(slot)
        return slot, header.base_offset, header.next_offset

    def _remembered(self, offset: int) -> tuple[int, int, int] | None:
        """``(slot, base offset, next offset)`` of the remembered entry beginning nearest at or below
        ``offset`` (it holds ``offset`` only if ``offset < next offset``), or None (no request)."""
        idx = self._index.bisect_right(offset) - 1
        if idx < 0:
            return None
        base, (slot, count) = self._index.peekitem(idx)
        return int(slot), int(base), int(base) + int(count)

    def _base_at(self, slot: int) -> tuple[int, EntryHeader | None]:
        """Where the entry at ``slot`` begins, with its header to remember; the previous entry's end and None
        when it is damaged. Runs on any thread (it only fetches)."""
        try:
            header = self.fetch_header(slot)
        except DamagedEntryError:
            return self.fetch_header(slot - 1).next_offset, None  # slot > the log start's: probes lie above it
        return header.base_offset, header


def _search_probes(lo: int, hi: int, lo_base: int, hi_next: int, offset: int) -> list[int]:
    """Slots in ``(lo, hi]`` whose headers one round of :meth:`PartitionLog.slot_for_offset` reads (sorted)."""
    if hi - lo <= SEARCH_PROBES:
        return list(range(lo + 1, hi + 1))
    guess = lo + (offset - lo_base) * (hi - lo + 1) // max(1, hi_next - lo_base)
    step = (hi - lo) / (SEARCH_PROBES - 1)
    spread = {lo + round(step * i) for i in range(1, SEARCH_PROBES - 1)}
    return sorted({min(max(slot, lo + 1), hi) for slot in (guess, guess + 1, *spread)})


def entry_of_lost(lost: LostEntry, header: EntryHeader | None = None) -> Entry:
    """The entry readers see in place of one marked lost: no data, and its LOST header, or ``header`` (the
    entry's own, when only its payload is damaged)."""
    return Entry(lost.slot, header or lost.header(), b"", lost.key, lost)


def _segment_entry(item: SegmentEntry) -> Entry:
    slot, header, data, inlined, where = item
    return Entry(slot, header, data, where, inlined=inlined)
