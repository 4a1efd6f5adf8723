"""Where a partition log ends: the tail search (PROTOCOL.md "Partition log", "Segments" "Appenders",
"Damage").

Holds :class:`TailSearch`, which learns the tail ``(next slot, next offset)`` (the first free slot and the log
end offset) and keeps the one cached in the :class:`~txn_core.partition.index.SlotIndex` current. How the tail
is learned lives here alone: the appender, the readers and the offset search ask this module.

The search: the first free slot at or above the loose floor (``max(log start slot, segments' chain end)``,
with the segment listing re-read: below the chain end loose slots may be missing because they were rolled).
A listing of ``log/`` made in the same round (:meth:`TailSearch.list_loose`) names a candidate, the slot
past the last one listed; it is taken only when, in one round, the slot before it is found present and the
candidate itself absent (a listing is a hint: it may be stale or eventually consistent). Otherwise, or
without a listing, :meth:`SlotLog.find_tail` gallops and bisects. The probes past the candidate
(:data:`~txn_core.partition.holes.HOLE_PROBES`) overlap the read of the header before it, which gives the
next offset. Then new slots are followed one GET each.

Invariants:

* **The tail is never a hole** (a missing slot with a later one present): the first free slot is the tail
  only if no probe past it finds an entry; else the search goes on above the one found. An append into a
  hole would give its offsets to a second entry.
* **A damaged entry with entries after it is stepped over; a damaged last entry makes the log end
  unknown**: :class:`DamagedEntryError` with its ``first_offset``, so appends fail until it is marked lost
  and readers stop at its first offset (:meth:`TailSearch.readable_tail`). A damaged run at the end that
  begins with a hole raises the hole's damage the same way.
* **A listing never decides the end**: the slot it names is the tail only once an existence check says it
  is absent, and the one before it present, and no probe past it finds an entry; a listing that missed new
  entries, or still shows deleted ones, costs a galloping search, never a wrong tail. Readers use the
  listing only to read the slots it names all at once (:meth:`TailSearch.listed_end`); each is still read.
* **A cached tail is re-checked after** ``TAIL_RECHECK_S`` (60 s): if the entry before it vanished
  (retention ran, or it was rolled), the tail is searched again from the loose floor; an appender's stale
  tail is guarded by retention's and rolling's ``min_age_ms`` (PROTOCOL.md "Retention" "Stale writers").

Locking: the index's lock guards the cached tail. :meth:`TailSearch.tail` holds it across the search's
requests (one search per process at a time: appends and other searches wait for its answer);
:meth:`TailSearch.tail_locked` and :meth:`TailSearch.loose_floor` expect the caller to hold it (the appender,
which claims its slot under it). The reads it makes remember what they see (:meth:`EntryFetcher.read_header`)
and take no lock. :meth:`TailSearch.free_slot` takes none: it only probes.

Crash windows: none (it only reads). An appender's are in :mod:`txn_core.partition.appender`.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

from txn_core.errors import CorruptDataError, DamagedEntryError, ObjectNotFoundError, StorageError
from txn_core.format.slotlog import SlotLog
from txn_core.partition.fetch import EntryFetcher
from txn_core.partition.holes import HOLE_PROBES, MISSING_CHECK, MissingSlots, probe_after
from txn_core.partition.index import SlotIndex
from txn_core.partition.logstart import LogStart, LogStartCache
from txn_core.partition.segments import SegmentCatalog
from txn_core.storage.parallel import submit

T = TypeVar("T")


class TailSearch:
    """Learns the tail of one partition log. Given the index holding the cached tail (and its lock), the log
    start, the segments, the slot log, :class:`MissingSlots` (whether a miss is a hole), the fetcher whose
    header reads remember, the monotonic clock and ``recheck_s``, asked at each use
    (``partition.TAIL_RECHECK_S``, which tests patch)."""

    def __init__(
        self,
        index: SlotIndex,
        starts: LogStartCache,
        segments: SegmentCatalog,
        entries: SlotLog,
        missing: MissingSlots,
        fetcher: EntryFetcher,
        *,
        monotonic: Callable[[], float],
        recheck_s: Callable[[], float],
    ) -> None:
        self.index = index
        self.starts = starts
        self.segments = segments
        self.entries = entries
        self.missing = missing
        self.fetcher = fetcher
        self.monotonic = monotonic
        self.recheck_s = recheck_s
        #: (the slot past the last loose entry listed, 0 for an empty listing; whether the listing was whole,
        #: else that slot is only a lower bound of the end; when the listing began)
        self._listed: tuple[int, bool, float] | None = None
        self._searched = False  # the last tail_locked searched (under the index's lock)

    def list_loose(self) -> tuple[int, bool] | None:
        """List ``log/``'s first page (one LIST) and remember the slot past the last entry it shows, a hint
        for :meth:`listed_end` and the next tail search: ``(slot, whole)``, ``whole`` False when more pages
        follow (then the slot is a lower bound). None when the store cannot list one page alone."""
        began = self.monotonic()
        listed = self.entries.listed_end()
        if listed is None:
            return None
        current = self._listed
        if current is None or current[2] <= began:
            self._listed = (*listed, began)
        return listed

    def listed_end(self) -> int | None:
        """The slot past the last loose entry of a listing younger than ``recheck_s()``: slots below it were
        listed, so readers read them all at once rather than in a slow start (each is still read; a stale
        listing only changes how many reads are in flight). None without such a listing."""
        listed = self._listed
        if listed is None or self.monotonic() - listed[2] >= self.recheck_s():
            return None
        return listed[0]

    def tail(self, refresh: bool = False) -> tuple[int, int]:
        """``(next slot, next offset)``: the first free slot and the log end offset."""
        with self.index.lock:
            slot, offset = self.tail_locked(refresh)
            if self._searched:
                return slot, offset  # found absent a moment ago, with none after it: no GET more
            return self._advance_locked(slot, offset)

    def readable_tail(self, refresh: bool = False) -> tuple[int, int]:
        """``(slot, offset)`` where reading stops now: the tail, or, when the last entry is damaged and
        not marked lost, that entry's slot and first offset (nothing after it exists yet)."""
        try:
            return self.tail(refresh)
        except DamagedEntryError as exc:
            if exc.first_offset is None:
                raise
            return exc.slot, exc.first_offset

    def tail_locked(self, refresh: bool) -> tuple[int, int]:
        """The cached tail (no request), re-checked after TAIL_RECHECK_S, else discovered. Hold the index's
        lock."""
        index = self.index
        now = self.monotonic()
        if index.tail is not None and not refresh:
            self._searched = False
            if now - index.tail_checked < self.recheck_s():
                return index.tail
            slot = index.tail[0]
            if slot == self.starts.log_start().slot or self.entries.exists(slot - 1):
                index.tail_checked = now
                return index.tail
            # The cached tail's predecessor vanished (retention ran, or it was rolled): rediscover.
        listing = submit(self.list_loose, leaf=True)  # in the same round as the segments and the log start
        start, lower = self.loose_floor(refresh=index.tail is not None)
        # The probes for holes past each candidate overlap the read of the header before it.
        _, tail = self._free_slot_past_holes(
            lower,
            lambda slot: (slot, start.offset) if slot == start.slot else self._after_last_readable(slot, start),
            _hint(listing),
        )
        index.tail, index.tail_checked = tail, now
        self._searched = True
        return tail

    def loose_floor(self, refresh: bool) -> tuple[LogStart, int]:
        """The log start, and the slot from which loose entries form a gap-free run up to the tail: the log
        start or the segments' chain end, whichever is higher (PROTOCOL.md "Segments", "Appenders"). The
        segment listing is always re-read (an appender that took a rolled slot for the log end would write
        into history), together with the log start when ``refresh``."""
        starts = self.starts
        self.segments.refresh(lambda: starts.log_start(refresh=True) if refresh or starts.start is None else None)
        start = starts.log_start()
        chain = self.segments.chain_end()
        return start, max(start.slot, chain if chain is not None else start.slot)

    def _after_last_readable(self, slot: int, start: LogStart) -> tuple[int, int]:
        """``(s, next offset)`` for the highest ``s <= slot`` whose previous entry is readable (or the log
        start): the entries before ``slot`` normally (one read); short of a damaged run at the end, which
        :meth:`_advance_locked` then meets, or an append at ``s`` collides with.

        A run may hold missing slots: below a present (damaged) slot, a miss is a hole, not the end. If the
        run begins with one, nothing would collide with an append there (its offsets would be reused by
        the entries after it): the hole's :class:`DamagedEntryError` is raised instead, with its first
        offset, so appends refuse and readers stop at it (:meth:`readable_tail`)."""
        s = slot
        holes: dict[int, DamagedEntryError] = {}
        asked: set[int] = set()
        while s > start.slot:
            try:
                offset = self.fetcher.read_header(s - 1).next_offset
            except DamagedEntryError as exc:
                if exc.check == MISSING_CHECK:
                    holes[s - 1] = exc
                s -= 1
                continue
            except ObjectNotFoundError:
                # Slot ``s`` is present (the search found it, or it was read damaged): a miss below it is a
                # hole once a fresh look says so (a miss read with a stale segment listing is raised as one).
                if s == slot or s - 1 in asked or not self.missing.is_hole(s - 1):
                    raise
                asked.add(s - 1)
                continue  # read it again: now a hole (damage), or its lost record
            return _unless_hole(holes, s, offset)
        return _unless_hole(holes, start.slot, start.offset)

    def _advance_locked(self, slot: int, offset: int) -> tuple[int, int]:
        """Follow slots created by others since the cached tail (one GET per new slot). A damaged entry
        with entries after it is stepped over; a damaged last entry raises :class:`DamagedEntryError`
        with its ``first_offset``: nobody knows where its offsets end."""
        damaged: DamagedEntryError | None = None  # the first of a run of damaged entries
        while True:
            try:
                header = self.fetcher.read_header(slot)
            except ObjectNotFoundError:
                if damaged is not None:  # only retention deletes entries: the run is the end after all
                    raise damaged from None
                break
            except DamagedEntryError as exc:
                if damaged is None:
                    exc.first_offset, damaged = offset, exc
                if not self.entries.exists(slot + 1):
                    self.index.tail = (damaged.slot, offset)  # appends after it fail; readers stop at it
                    raise damaged from None
                slot += 1
                continue
            damaged = None
            slot, offset = slot + 1, header.next_offset
        self.index.tail = (slot, offset)
        return slot, offset

    def free_slot(self, lower: int) -> int:
        """The first free slot at or above ``lower`` that no entry follows (see :meth:`_free_slot_past_holes`)."""
        return self._free_slot_past_holes(lower, lambda slot: None)[0]

    def _free_slot_past_holes(
        self, lower: int, beside: Callable[[int], T], hint: tuple[int, bool] | None = None
    ) -> tuple[int, T]:
        """The first free slot at or above ``lower`` that no entry follows, and ``beside`` of it.

        :meth:`SlotLog.find_tail` gives the first free slot (or ``hint``, a listing's candidate, when the slot
        before it is present and it is absent: :meth:`_listed_candidate`); it is the tail only if no slot
        shortly after it (:data:`HOLE_PROBES`) is present: a missing slot below a present one is a hole
        (PROTOCOL.md "Damage"), and an append there would reuse the offsets of the entries after it. Past a
        hole (or past racing appends) the search goes on. ``beside(candidate)`` runs while the probes past it
        are in flight."""
        seen: dict[int, bool] = {}
        if hint is not None and hint[0] > lower:
            listed = self._listed_candidate(hint[0], beside, seen)
            if isinstance(listed, int):
                lower = listed  # a partial listing: the end lies further, its last entry present
            elif listed is not None:
                return listed
            else:
                seen.clear()
        slot = self.entries.find_tail(lower, near=hint is not None and hint[1] and hint[0] <= lower, seen=seen)
        while True:
            later = probe_after(self.entries, slot, HOLE_PROBES, seen)
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

    def _listed_candidate(
        self, hint: int, beside: Callable[[int], T], seen: dict[int, bool]
    ) -> tuple[int, T] | int | None:
        """The tail at ``hint`` (the slot past a listing's last entry), checked in one round: the slot before
        it present, it absent, no slot of :data:`HOLE_PROBES` past it present, and ``beside(hint)`` beside
        them. ``hint`` alone when the slot before it and it are both present (a partial or stale listing: the
        search goes on from there); None when the slot before it is absent (the listing showed entries
        deleted since: the caller searches as without one); a later slot present goes on as a search past a
        hole does."""
        checks = probe_after(self.entries, hint - 2, (1, 2), seen)  # hint - 1 and hint
        later = probe_after(self.entries, hint, HOLE_PROBES, seen)
        got: T | BaseException
        try:
            got = beside(hint)
        except (CorruptDataError, ObjectNotFoundError) as exc:
            got = exc
        (_, before), (_, at) = checks
        seen.update({hint - 1: before.result(), hint: at.result()})
        if not before.result() or at.result():
            for _, f in later:
                f.result()  # no request is left running behind the caller
            # The listing missed new entries (or had more pages), or showed ones deleted since.
            return hint if before.result() else None
        if any(f.result() for _, f in later):
            return None  # a hole past the candidate, or appends since: the search goes on from there
        if isinstance(got, BaseException):
            raise got
        return hint, got


def _hint(listing: Future[tuple[int, bool] | None]) -> tuple[int, bool] | None:
    """What a listing of ``log/`` says of the tail (:meth:`TailSearch.list_loose`), or None when it failed
    or could not be made (a hint: never needed)."""
    try:
        return listing.result()
    except StorageError:
        return None


def _unless_hole(holes: dict[int, DamagedEntryError], slot: int, offset: int) -> tuple[int, int]:
    """``(slot, offset)`` as the tail, unless ``slot`` is a hole: then its damage, with ``offset`` as its
    first offset (an append there would collide with nothing)."""
    hole = holes.get(slot)
    if hole is not None:
        hole.first_offset = offset
        raise hole
    return slot, offset
