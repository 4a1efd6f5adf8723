"""Reading a partition's entries in slot order with several reads in flight (PROTOCOL.md "Reading").

On an object store each entry read is a round trip; reading a partition's history one entry after another
costs one round trip per entry. :class:`ReadAhead` keeps up to ``depth`` reads of the next slots in flight
on the leaf pool (:mod:`txn_core.storage.parallel`) and hands out their results strictly in slot order.

Invariants:

* **Order and effects.** Results are returned in slot order, and everything with an effect on shared
  state (the partition's cache of where entries are, its tail) happens on the caller's thread as each
  result is returned; the pool threads only read bytes.
* **Errors stay where they are.** A read that fails (missing slot, damage, storage error) raises at
  *its* slot, after every earlier slot was returned; the reads behind it are discarded and re-issued
  by the next call, so nothing past a problem is ever handed out first.
* **Adaptive depth, bounded memory.** Past listed slots (below), the depth starts at 1 and doubles with
  each successful result from the second in a row on, up to ``max_depth``; it is capped so that the reads
  in flight hold about ``max_bytes`` (by the sizes seen so far). A missing slot (the log end) sets it to
  the number of entries the run before it returned, plus one, when that run began at a miss (a catch-up
  from a seek or from opening sets it to 1): a reader polling a steady stream that finds
  ``k`` new entries per call reads them and the slot past them in one round trip at the next call (at
  most ``k`` reads more than reading one by one when fewer came; the depth grows again only past that
  window); one that found nothing pays one request per call to learn that nothing is new; one that is
  catching up reaches full depth in a few round trips. Reads issued ahead of a missing slot miss too
  when it starts a run of missing slots (a hole): :mod:`txn_core.partition.holes` counts such misses,
  returning in any order, as one run.
* **A stop slot bounds the reading ahead.** A reader told where its range ends (``stop``: no slot at or
  past it is needed) issues no read there ahead of need; a slot asked for is read wherever it is. The
  slots below the stop were seen by the planner, so they are known to exist and are issued at once (as
  listed slots are, below), within the byte budget.
* **Reads are not cancelled.** A read issued is left to finish when its result is discarded, so the
  requests a scan makes depend only on what the log holds, not on thread timing.
* **A read issued ahead may be stale.** Its "not found" may answer for a moment before the entry was
  appended; where this process knows the slot lies below the tail (``PartitionLog.known_tail_slot``), the
  slot is read again before a miss is raised (a caught-up reader, at the tail, pays nothing more).
* **Listed slots are read at once.** Slots below the end a recent listing of ``log/`` showed
  (:meth:`PartitionLog.listed_end`), and that end itself, are issued at full depth and within the byte
  budget from the first call: a fresh reader of a small partition reads it in one round trip, the read of
  the listed end telling whether the log ends there; nothing past it is issued before that read found it
  (then the depth grows as past any slot). The listing only sets how many reads are in flight; every slot
  is still read, and a miss is handled as any other.
* **Segments are read in spans.** Slots a segment holds (PROTOCOL.md "Segments") are known to exist: one
  read fetches as many of them as fit in :data:`CHUNK_BYTES` (a header scan takes them from the index),
  and such reads are issued at full depth at once, within the same byte budget. A span whose segment
  turns out shorter than planned (its end was not known yet) hands out what it holds; the reads behind it
  are dropped and issued again from there.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Generic, TypeVar, cast

from txn_core.errors import ObjectNotFoundError
from txn_core.format.entry import HEADER_SIZE, EntryHeader
from txn_core.format.segment import SegmentSpan
from txn_core.partition.partition import Entry, EntrySpan, PartitionLog
from txn_core.storage.parallel import submit

T = TypeVar("T")

#: Reads one reader keeps in flight at most (the shared pool bounds the process as a whole).
MAX_DEPTH = 64
#: Bytes the reads in flight of one reader may hold, by the entry sizes seen so far.
MAX_BYTES = 32 << 20
#: Bytes one read of a segment's entries fetches at most (beyond its first entry)...
CHUNK_BYTES = 4 << 20
#: ...and entries: a reader starts on the first entries of a span while the next spans are read and sliced.
SPAN_ENTRIES = 2048
#: While handing out a span's entries, look this often whether more reads can be issued.
REISSUE_EVERY = 256


class _Ready(Generic[T]):
    """Results read and not yet handed out, in slot order: lists of them, or the entries of a segment span
    (:class:`EntrySpan`), made one at a time as they are handed out (or passed over by columns)."""

    __slots__ = ("_chunks", "_len")

    def __init__(self) -> None:
        self._chunks: deque[list[Any]] = deque()  # [results or EntrySpan, index of the next one]
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def extend(self, items: list[T] | EntrySpan) -> None:
        if len(items):
            self._chunks.append([items, 0])
            self._len += len(items)

    def clear(self) -> None:
        self._chunks.clear()
        self._len = 0

    def popleft(self) -> T:
        chunk = self._chunks[0]
        items, i = chunk
        item = cast("T", items.entry(i) if isinstance(items, EntrySpan) else items[i])
        self._advance(chunk, 1)
        return item

    def head_span(self) -> tuple[SegmentSpan, int] | None:
        if not self._chunks or not isinstance(self._chunks[0][0], EntrySpan):
            return None
        items, i = self._chunks[0]
        return items.span, i

    def skip(self, n: int) -> tuple[SegmentSpan, int]:
        """Pass over ``n`` results of the span at the head; the span and where they began."""
        chunk = self._chunks[0]
        items, i = chunk
        if not isinstance(items, EntrySpan) or not 0 < n <= len(items) - i:
            raise ValueError(f"cannot pass over {n} results of {items!r} from {i}")
        self._advance(chunk, n)
        return items.span, i

    def _advance(self, chunk: list[Any], n: int) -> None:
        chunk[1] += n
        self._len -= n
        if chunk[1] == len(chunk[0]):
            self._chunks.popleft()


class _Ahead(Generic[T]):
    """Results of ``fetch(slot, count, max_bytes)`` (a list of one result per slot from ``slot`` on) in slot
    order (see module doc); ``size`` weighs one result."""

    def __init__(
        self,
        plog: PartitionLog,
        slot: int,
        fetch: Callable[[int, int, int], list[T] | EntrySpan],
        header: Callable[[T], EntryHeader],
        size: Callable[[T], int],
        max_depth: int,
        max_bytes: int,
        stop: int | None = None,
    ) -> None:
        self.plog = plog
        self.stop = stop
        self.max_depth = max(1, max_depth)
        self.max_bytes = max_bytes
        self._fetch, self._header, self._size = fetch, header, size
        self._next = slot  # the slot the next call returns
        self._issued = slot  # the first slot not yet asked for
        self._ready: _Ready[T] = _Ready()  # results of the oldest read, not yet handed out
        self._ready_rolled = False  # they come from a segment (its index knows where they are)
        self._inflight: deque[tuple[int, int, Future[list[T] | EntrySpan]]] = deque()  # (first slot, slots, read)
        #: the first slot past a read in flight whose segment index is not known yet (None: no such read);
        #: nothing is issued beyond it until that read returns, so the next reads are planned with the index
        self._planning: int | None = None
        self._depth = 1
        self._streak = 0
        self._run = 0  # results handed out since the last miss
        self._paced = False  # the run began at a miss (a reader at the end): its length is the stream's pace
        self._hold = 0  # results of the window a miss sized still to come before the depth grows again
        self._avg_bytes = float(HEADER_SIZE)

    @property
    def slot(self) -> int:
        """The slot the next :meth:`next` returns."""
        return self._next

    def seek(self, slot: int) -> None:
        """Continue at ``slot`` (results of reads in flight for other slots are dropped)."""
        if slot != self._next:
            self._ready.clear()
            self._inflight.clear()  # left to finish (see module doc); their results are dropped
            self._next = self._issued = slot
            self._depth, self._streak, self._run, self._hold = 1, 0, 0, 0
            self._paced = False

    def start(self, slot: int) -> None:
        """Continue at ``slot`` and issue its first reads now (a reader that will start there overlaps them
        with what it reads first)."""
        self.seek(slot)
        self._issue()

    def _issue(self) -> None:
        """Issue reads up to the depth and byte budget: spans of segments at once, loose slots by depth."""
        avg = max(self._avg_bytes, 1.0)
        loose = min(self._depth, max(1, int(self.max_bytes // avg)))
        listed = self.plog.listed_end()  # slots a recent listing showed, and the one past them: no slow start
        if self._planning is not None and not any(s < self._planning and not f.done() for s, _n, f in self._inflight):
            self._planning = None  # that read is done (the segment's index is known now) or was dropped
        while len(self._inflight) < self.max_depth and self._planning is None:
            pending = self._issued - self._next - len(self._ready)
            if self._inflight and pending * avg >= self.max_bytes:
                return
            want = max(1, min(SPAN_ENTRIES, int(CHUNK_BYTES // avg)))
            if self.stop is not None:
                if self._issued > self._next and self._issued >= self.stop:
                    return  # nothing below the stop is left to read ahead
                want = max(1, min(want, self.stop - self._issued))
            count, exact = self.plog.segments.plan(self._issued, want, CHUNK_BYTES)
            if count == 0:
                if listed is not None and self._next <= listed < self._issued:
                    return  # past the listed end only once its read said it exists (the listing was stale)
                known = self.stop is not None and self._issued < self.stop  # the planner saw it
                if len(self._inflight) >= loose and (listed is None or self._issued > listed) and not known:
                    return
                count = 1
            self._inflight.append(
                (self._issued, count, submit(self._fetch, self._issued, count, CHUNK_BYTES, leaf=True))
            )
            self._issued += count
            if not exact:  # the segment is being opened: plan the next reads with its index
                self._planning = self._issued

    def _take(self) -> T:
        self._await_ready()
        item = self._ready.popleft()
        if len(self._ready) % REISSUE_EVERY == 0 and self._ready:
            self._issue()  # a segment opened meanwhile: read its spans while these entries are handed out
        if not self._ready_rolled:  # a segment's slots are found through its index, and lie below the tail
            self.plog.remember(self._next, self._header(item))
        self._next += 1
        self._run += 1
        self._avg_bytes += (self._size(item) - self._avg_bytes) / 8
        return item

    def _await_ready(self) -> None:
        """Have the next slot's result ready: wait for the oldest read (issuing reads first when none is in
        flight). Raises what reading that slot raised (see module doc)."""
        if not self._ready:
            self._issue()
            slot, count, fut = self._inflight.popleft()
            try:
                try:
                    items = fut.result()
                except ObjectNotFoundError:
                    known = self.plog.known_tail_slot()
                    if known is None or slot >= known:
                        raise
                    # Issued ahead, it answered for an earlier moment: the slot exists now, as this process
                    # knows. Read it again (reads in flight behind it may be as old: dropped).
                    self._inflight.clear()
                    self._issued = slot + count
                    items = self._fetch(slot, count, CHUNK_BYTES)
            except BaseException:
                self._inflight.clear()
                self._issued = self._next
                # the next call reads as many slots at once as this run found, and the one past them
                pace = self._run if self._paced else 0  # a catch-up from a seek or open says nothing of it
                self._depth, self._streak, self._run = max(1, min(self.max_depth, pace + 1)), 0, 0
                self._paced = True
                self._hold = self._depth  # no growth within that window: its last read may well miss
                raise
            if len(items) < count:  # a segment ended before the span: read on from where it ended
                self._inflight.clear()
                self._issued = slot + len(items)
            self._ready.extend(items)
            self._ready_rolled = count > 1 or self.plog.segments.plan(slot, 1, 0)[0] > 0
            self._streak += 1
            if self._hold:
                self._hold -= 1
            elif self._streak >= 2:
                self._depth = min(self.max_depth, self._depth * 2)
            if isinstance(items, EntrySpan):
                self._issue()  # the segment's index is known now: its next spans are read while this one is used


class ReadAhead(_Ahead[Entry]):
    """Whole entries of ``plog`` from slot ``slot`` on, in order (see module doc)."""

    def __init__(
        self,
        plog: PartitionLog,
        slot: int = 0,
        *,
        max_depth: int = MAX_DEPTH,
        max_bytes: int = MAX_BYTES,
        stop: int | None = None,
    ) -> None:
        super().__init__(
            plog, slot, plog.fetch_entries, lambda e: e.header, lambda e: e.nbytes, max_depth, max_bytes, stop
        )

    def next(self) -> Entry:
        """The entry at :attr:`slot`, then advance. Raises what reading that slot raised (the position
        stays, so the next call retries it)."""
        return self._take()

    def peek_span(self) -> tuple[SegmentSpan, int] | None:
        """The segment span holding :attr:`slot` and the slot's index in it, when the next entries were
        read from a segment (None: the next entry is a loose one; :meth:`next` hands it out). Nothing is
        handed out; raises what :meth:`next` would."""
        self._await_ready()
        return self._ready.head_span()

    def skip_span(self, n: int) -> None:
        """Hand out the next ``n`` entries of the span :meth:`peek_span` gave (the caller took them from
        the span's columns)."""
        span, i = self._ready.skip(n)
        if self._ready:
            self._issue()
        rows = span.rows[i : i + n]
        size = float((rows["length"].sum() + rows["data_len"].sum()) / max(n, 1))
        self._next += n
        self._run += n
        self._avg_bytes += (size - self._avg_bytes) * (1 - (7 / 8) ** n)


class HeaderReadAhead(_Ahead[EntryHeader]):
    """Entry headers of ``plog`` from ``slot`` on, in order, by ranged reads (the transaction buffer's
    scans, the CLI's dump). A header is 128 bytes: the depth is bounded by ``max_depth`` only."""

    def __init__(self, plog: PartitionLog, slot: int = 0, *, max_depth: int = MAX_DEPTH) -> None:
        super().__init__(
            plog,
            slot,
            lambda s, n, _b: plog.fetch_headers(s, n),
            lambda h: h,
            lambda h: HEADER_SIZE,
            max_depth,
            MAX_BYTES,
        )

    def next(self, slot: int) -> EntryHeader:
        """The header at ``slot`` (read ahead of it when ``slot`` continues the previous call)."""
        self.seek(slot)
        return self._take()
