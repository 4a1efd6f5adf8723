"""Reading a partition's entries in slot order with several reads in flight (PROTOCOL.md "Reading").

On an object store each entry read is a round trip; reading a partition's history one entry after another
costs one round trip per entry. :class:`ReadAhead` keeps up to ``depth`` reads of the next slots in flight
on the leaf pool (:mod:`txn_core.parallel`) and hands out their results strictly in slot order.

Invariants:

* **Order and effects.** Results are returned in slot order, and everything with an effect on shared
  state (the partition's cache of where entries are, its tail) happens on the caller's thread as each
  result is returned; the pool threads only read bytes.
* **Errors stay where they are.** A read that fails (missing slot, damage, storage error) raises at
  *its* slot, after every earlier slot was returned; the reads behind it are discarded and re-issued
  by the next call, so nothing past a problem is ever handed out first.
* **Adaptive depth, bounded memory.** The depth starts at 1 and doubles with each successful result from
  the second in a row on, up to ``max_depth``; it is capped so that the reads in flight hold about
  ``max_bytes`` (by the sizes seen so far). A missing slot (the log end) drops it back to 1: a reader
  that has caught up pays one request per call to learn that nothing is new, one that finds one or two
  new entries pays at most one read more than reading them one by one, and one that is catching up
  reaches full depth in a few round trips.
* **Reads are not cancelled.** A read issued is left to finish when its result is discarded, so the
  requests a scan makes depend only on what the log holds, not on thread timing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Generic, TypeVar

from txn_core.entry import HEADER_SIZE, EntryHeader
from txn_core.parallel import submit
from txn_core.partition import Entry, PartitionLog

T = TypeVar("T")

#: Reads one reader keeps in flight at most (the shared pool bounds the process as a whole).
MAX_DEPTH = 64
#: Bytes the reads in flight of one reader may hold, by the entry sizes seen so far.
MAX_BYTES = 32 << 20


class _Ahead(Generic[T]):
    """Results of ``fetch(slot)`` from a slot on, in slot order (see module doc); ``size`` weighs one."""

    def __init__(
        self,
        plog: PartitionLog,
        slot: int,
        fetch: Callable[[int], T],
        header: Callable[[T], EntryHeader],
        size: Callable[[T], int],
        max_depth: int,
        max_bytes: int,
    ) -> None:
        self.plog = plog
        self.max_depth = max(1, max_depth)
        self.max_bytes = max_bytes
        self._fetch, self._header, self._size = fetch, header, size
        self._next = slot  # the slot the next call returns
        self._issued = slot  # the first slot not yet asked for
        self._inflight: deque[tuple[int, Future[T]]] = deque()
        self._depth = 1
        self._streak = 0
        self._avg_bytes = float(HEADER_SIZE)

    @property
    def slot(self) -> int:
        """The slot the next :meth:`next` returns."""
        return self._next

    def seek(self, slot: int) -> None:
        """Continue at ``slot`` (results of reads in flight for other slots are dropped)."""
        if slot != self._next:
            self._inflight.clear()  # left to finish (see module doc); their results are dropped
            self._next = self._issued = slot
            self._depth, self._streak = 1, 0

    def _take(self) -> T:
        want = min(self._depth, max(1, int(self.max_bytes // max(self._avg_bytes, 1.0))))
        while len(self._inflight) < want:
            self._inflight.append((self._issued, submit(self._fetch, self._issued, leaf=True)))
            self._issued += 1
        slot, fut = self._inflight.popleft()
        try:
            item = fut.result()
        except BaseException:
            self._inflight.clear()
            self._issued = self._next
            self._depth, self._streak = 1, 0
            raise
        self.plog.remember(slot, self._header(item))
        self._next = slot + 1
        self._avg_bytes += (self._size(item) - self._avg_bytes) / 8
        self._streak += 1
        if self._streak >= 2:
            self._depth = min(self.max_depth, self._depth * 2)
        return item


class ReadAhead(_Ahead[Entry]):
    """Whole entries of ``plog`` from slot ``slot`` on, in order (see module doc)."""

    def __init__(
        self, plog: PartitionLog, slot: int = 0, *, max_depth: int = MAX_DEPTH, max_bytes: int = MAX_BYTES
    ) -> None:
        super().__init__(plog, slot, plog.fetch_entry, lambda e: e.header, lambda e: len(e.data), max_depth, max_bytes)

    def next(self) -> Entry:
        """The entry at :attr:`slot`, then advance. Raises what reading that slot raised (the position
        stays, so the next call retries it)."""
        return self._take()


class HeaderReadAhead(_Ahead[EntryHeader]):
    """Entry headers of ``plog`` from ``slot`` on, in order, by ranged reads (the transaction buffer's
    scans, the CLI's dump). A header is 128 bytes: the depth is bounded by ``max_depth`` only."""

    def __init__(self, plog: PartitionLog, slot: int = 0, *, max_depth: int = MAX_DEPTH) -> None:
        super().__init__(plog, slot, plog.fetch_header, lambda h: h, lambda h: HEADER_SIZE, max_depth, MAX_BYTES)

    def next(self, slot: int) -> EntryHeader:
        """The header at ``slot`` (read ahead of it when ``slot`` continues the previous call)."""
        self.seek(slot)
        return self._take()
