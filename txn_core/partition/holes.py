"""What a missing loose slot of a partition log is: rolled, removed by retention, a hole, or the log end
(PROTOCOL.md "Damage", "Segments" "Readers", "Retention").

Holds :class:`MissingSlots`, the questions asked of a slot whose loose object a read did not find, the probes
of the slots after it (:func:`probe_after`, :data:`HOLE_PROBES`), and :data:`MISSING_CHECK`, the check a
hole fails.

Invariants:

* **A hole is never the log end.** Slot ``n + 1`` is created only by a writer that read slot ``n``, so above
  the log start and the segments' chain a missing slot with a present successor has no other cause than
  deletion by hand or loss by the store: it is damage (``missing: ...``), and an append there would give
  its offsets to a second entry.
* **A slot is called a hole only after a fresh look**: a segment listing and a log-start read begun after
  the miss (it was not rolled, retention did not remove it) and a look at both slots, the missing one asked
  after the later one was seen (a racing append does not look like a hole).
* **A reader learns of a hole in bounded time**: a miss below the tail it knows, or within
  ``LOG_START_RECHECK_S`` (two missing slots or fewer, :data:`HOLE_PROBES_CHEAP` beside its periodic
  segment listing) or ``TAIL_RECHECK_S`` (a longer run, all of :data:`HOLE_PROBES`; or a slot the reader
  kept finding absent at the end, below), not a round trip more. Misses of slots within the cheap probes'
  reach of each other are one run, in whatever order they come back (reads issued ahead miss the slots
  past the one asked for): they do not start the run's clock again. A loose listing younger than
  ``TAIL_RECHECK_S`` that shows a slot past the missing one (``listed_end``) adds that slot to the probes at
  once: a run wider than :data:`HOLE_PROBES` reach, with entries after it, is found from it.
* **A quiet end costs one request per poll.** A slot found absent after a full look (a segment listing and
  a log start at most ``LOG_START_RECHECK_S`` old, nothing after it) and missed again less than
  ``TAIL_RECHECK_S`` later is still the end, with no listing: it was absent then, and had it been created
  since, neither rolling nor retention could have deleted it yet (both keep entries for ``min_age_ms``,
  at least twice ``TAIL_RECHECK_S``: PROTOCOL.md "Retention" "Stale writers"). So a reader polling an
  idle partition pays its GET of the slot, and the full look once per ``TAIL_RECHECK_S``.
* **A slot is reported removed by retention** only when it lies below a log start read at most
  ``LOG_START_RECHECK_S`` ago, or below one already seen to exist and a fresh log start.

Locking: none. The state (the slot a reader keeps missing and since when, the slots found to be holes) is
replaced whole or added to, and only steers how soon the next look is made; the tail is read from the
:class:`~txn_core.partition.index.SlotIndex` without its lock (one immutable value). Probes run on the leaf
pool.

Crash windows: none (it only reads); how holes arise and are marked lost is in PROTOCOL.md "Damage".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future

from txn_core.errors import CorruptDataError
from txn_core.format.slotlog import SlotLog
from txn_core.partition.index import SlotIndex
from txn_core.partition.logstart import LogStartCache
from txn_core.partition.segments import SegmentCatalog
from txn_core.storage.parallel import submit

#: The check a hole fails (PROTOCOL.md "Damage"): what readers, ``damaged`` and ``inspect`` report for it.
MISSING_CHECK = "missing: the object is gone although later entries exist"

#: Distances past a free slot probed, all at once, before it is taken for the tail: an entry present at any
#: of them makes the free slot a hole, not the tail. Every distance up to 8 (a run of up to 7 missing slots
#: with any entry after it), then sparser (a wider run, in a log that goes on past it).
HOLE_PROBES = (1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64)
#: The same for a reader polling at what it takes for the log end (beside its periodic listing) and for an
#: appender that lost a create race (beside the winner's header read): few, as they are paid often.
HOLE_PROBES_CHEAP = (1, 2)


def probe_after(
    entries: SlotLog, slot: int, distances: Sequence[int], seen: dict[int, bool]
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
            out.append((probe, submit(entries.exists, probe, leaf=True)))
    return out


class MissingSlots:
    """Answers for the missing loose slots of one partition log. Given its slot log, its segments, its log
    start and its index (for the tail), the monotonic clock, and the staleness bounds asked at each use:
    ``log_start_recheck_s`` (``partition.LOG_START_RECHECK_S``) and ``tail_recheck_s``
    (``partition.TAIL_RECHECK_S``), which tests patch."""

    def __init__(
        self,
        entries: SlotLog,
        segments: SegmentCatalog,
        starts: LogStartCache,
        index: SlotIndex,
        *,
        monotonic: Callable[[], float],
        log_start_recheck_s: Callable[[], float],
        tail_recheck_s: Callable[[], float],
        listed_end: Callable[[], int | None] = lambda: None,
    ) -> None:
        self.entries = entries
        self.listed_end = listed_end
        self.segments = segments
        self.starts = starts
        self.index = index
        self.monotonic = monotonic
        self.log_start_recheck_s = log_start_recheck_s
        self.tail_recheck_s = tail_recheck_s
        self._missing_since: tuple[int, float] | None = None  # (slot, when): a reader kept missing it since
        self._holes: set[int] = set()  # slots found to be holes: a later miss there asks again at once
        self._absent: tuple[int, float] | None = None  # (slot, when) last found absent as the end (module doc)

    def _still_absent(self, slot: int) -> bool:
        """Whether ``slot`` was found absent as the end less than ``TAIL_RECHECK_S`` ago (a quiet end)."""
        absent = self._absent
        return absent is not None and absent[0] == slot and self.monotonic() - absent[1] < self.tail_recheck_s()

    def deleted(self, slot: int, *, max_staleness_s: float | None = None) -> bool:
        """Whether a missing ``slot`` was removed by retention (it lies below the published log start).

        Re-reads the log start at most every ``max_staleness_s`` seconds (default
        ``LOG_START_RECHECK_S``), so polling the tail stays at one request per poll.
        """
        if self._still_absent(slot):
            return False  # found absent a moment ago: retention cannot have deleted it since
        if slot < self.starts.recent_log_start(max_staleness_s).slot:
            return True
        tail = self.index.tail
        if tail is not None and slot < tail[0]:
            # A slot below one already seen to exist cannot be the log end: it was deleted, whatever
            # the cached log start says. Re-read the start to confirm.
            return slot < self.starts.log_start(refresh=True).slot
        return False

    def relist_after_miss(self, slot: int) -> bool:
        """After ``slot`` was missing as a loose object: re-list the segments if there is no listing yet, it
        is older than LOG_START_RECHECK_S, or ``slot`` lies below a slot known to exist. A log start as old
        is re-read at the same time (the caller's next question is whether retention removed the slot), so
        a reader polling the log end pays one round trip per LOG_START_RECHECK_S for both. Returns whether
        an entry after ``slot`` is known to exist: the cached tail lies past it, or, when the listing was
        stale, probes of the next slots (:meth:`_probes_at`) made beside the listing found one: a reader
        stopped at a hole learns of it within LOG_START_RECHECK_S (two missing slots or fewer) or
        TAIL_RECHECK_S (a longer run), at two more requests each time, not one more round trip."""
        tail = self.index.tail
        known = tail is not None and slot + 1 < tail[0]
        now = self.monotonic()
        listed = self._listed_past(slot, ())
        if not known and not listed and self._still_absent(slot):
            return False  # a quiet end: no listing (module doc)
        stale = not self.segments.listed_within(self.log_start_recheck_s())
        distances: Sequence[int] = self._probes_at(slot) if stale else ()
        distances = [*distances, *self._listed_past(slot, distances)] if not known else []
        probes = probe_after(self.entries, slot, distances, {})
        if stale or (tail is not None and slot < tail[0]):
            self.segments.refresh(self.starts.recent_log_start)
        later = known or slot in self._holes or self.segments.starts_after(slot) or any(f.result() for _, f in probes)
        if not later and slot >= self.starts.log_start().slot:
            # A full look found nothing after it and retention had not removed it, as of its listing (begun
            # now, or at most LOG_START_RECHECK_S ago). The caller then asks that listing for the slot: a slot
            # found rolled is read from its segment, and no miss of it follows.
            self._absent = (slot, now if stale else now - self.log_start_recheck_s())
        return later

    def _probes_at(self, slot: int) -> Sequence[int]:
        """The distances a reader missing ``slot`` probes past it: HOLE_PROBES_CHEAP, and all of HOLE_PROBES once
        every TAIL_RECHECK_S while it keeps missing in the same run of missing slots. A miss within the cheap
        probes' reach of the run's first miss is the same run: reads issued ahead miss the slots after the
        one asked for, and their misses come back in any order: none of them starts the run's clock again."""
        now = self.monotonic()
        since = self._missing_since
        if since is None or abs(slot - since[0]) > HOLE_PROBES_CHEAP[-1]:
            self._missing_since = (slot, now)
            return HOLE_PROBES_CHEAP
        if now - since[1] < self.tail_recheck_s():
            return HOLE_PROBES_CHEAP
        self._missing_since = (slot, now)
        return HOLE_PROBES

    def _listed_past(self, slot: int, distances: Sequence[int]) -> list[int]:
        """The distance from ``slot`` to the last loose slot a recent listing showed, when that lies past it
        and is not among ``distances`` (the probes made anyway): a run of missing slots wider than the
        probes reach, with entries after it, is found from the listing, then confirmed by a look at that
        slot. Else none."""
        end = self.listed_end()
        if end is None or end - 1 <= slot or end - 1 - slot in distances:
            return []
        return [end - 1 - slot]

    def recheck(self) -> None:
        """Re-list the segments with a listing started after a miss (a listing shared with a reader whose
        listing began earlier could predate a roll), then re-read the log start, before a miss is called a
        hole (two round trips, on that rare path only)."""
        self.segments.refresh()
        self.segments.refresh()
        self.starts.log_start(refresh=True)  # after the listing: a segment retention deleted is past this start

    def hole(self, slot: int) -> bool:
        """Whether the missing loose ``slot`` is a hole: missing still, with a slot shortly after it present
        (HOLE_PROBES) or a segment starting after it (the later entries may all be rolled, their loose
        objects deleted), and neither removed by retention (the log start lies at or below it) nor rolled
        (the caller asked the fresh segment listing, :meth:`recheck`). A hole arises only when an object is
        deleted by hand or lost by the store: slot ``n + 1`` is created only by a writer that read slot ``n``
        (PROTOCOL.md "Damage")."""
        if slot < self.starts.log_start().slot:
            return False
        if self.segments.starts_after(slot):
            # Read after the caller's segment lookup: had retention removed the segment holding the slot
            # since the listing, it published this log start first.
            hole = slot >= self.starts.log_start(refresh=True).slot and not self.entries.exists(slot)
        else:
            distances = [*HOLE_PROBES, *self._listed_past(slot, HOLE_PROBES)]
            later = any(f.result() for _, f in probe_after(self.entries, slot, distances, {}))
            hole = later and not self.entries.exists(slot)  # asked after a later slot was seen (a racing append)
        if hole:  # a later miss there is damage at once, not the log end until the next look (5 s)
            self._holes.add(slot)
        return hole

    def is_hole(self, slot: int) -> bool:
        """Whether ``slot``, found missing, is a hole (:meth:`hole`), asked with a fresh segment listing and
        log start (a few requests: for callers that already know the slot lies inside the log)."""
        self.recheck()
        return self.segments.header(slot) is None and self.hole(slot)

    def missing_check(self, slot: int) -> CorruptDataError:
        """The check a hole at ``slot`` fails (see :meth:`is_hole`)."""
        key = self.entries.key(slot)
        return CorruptDataError(f"{key}: {MISSING_CHECK}", key, MISSING_CHECK)
