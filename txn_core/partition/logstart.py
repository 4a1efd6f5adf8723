"""Where one partition log starts, as this process knows it (PROTOCOL.md "Retention").

Holds :class:`LogStart`, the first slot and offset still present, and :class:`LogStartCache`, the newest
``<path>/start/<020d slot>`` marker this process read and when it read it.

Invariants: retention publishes a log start before it deletes anything below it, and the newest marker
wins, so the cached start never lies above the real one: a slot below it was removed by retention. A slot at
or above it was either not removed or removed since the cache was read; the cache is re-read (one LIST) when
older than the staleness bound its owner gives (``LOG_START_RECHECK_S``, 5 s, on the polling paths), and
at once before an offset is reported removed (:meth:`LogStartCache.log_start_for`; for a slot,
:meth:`txn_core.partition.holes.MissingSlots.deleted`). Until then a process that never saw a removed slot
may take it for the log end: it sees no new data for up to that long, never a wrong offset or a lost row.

Locking: none. The cache is one immutable value and its time, each replaced whole; threads that re-read at
once each pay a LIST, and the value either of them leaves is a marker that existed (at worst an older
one, which a later re-read replaces).

Crash windows: none (it only reads). Retention's own windows are in PROTOCOL.md "Retention".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from txn_core.errors import ObjectNotFoundError
from txn_core.format import envelope, paths
from txn_core.partition.segments import SegmentCatalog
from txn_core.storage.base import Storage


@dataclass(frozen=True, slots=True)
class LogStart:
    """The first slot and offset still present (retention moves it forward)."""

    slot: int
    offset: int
    #: bytes of all entries below the start (removed by retention so far)
    bytes_before: int = 0


class LogStartCache:
    """The log start of the partition log at ``path``, re-read when older than ``recheck_s()`` seconds.

    ``recheck_s`` is asked at each use (it reads ``partition.LOG_START_RECHECK_S``, which tests patch);
    ``segments`` is the partition's catalog, whose first listing overlaps the first read of the start."""

    def __init__(
        self,
        storage: Storage,
        path: str,
        segments: SegmentCatalog,
        *,
        monotonic: Callable[[], float],
        recheck_s: Callable[[], float],
    ) -> None:
        self.storage = storage
        self.path = path
        self.segments = segments
        self.monotonic = monotonic
        self.recheck_s = recheck_s
        self.start: LogStart | None = None
        self.checked = 0.0  # when ``start`` was read (monotonic seconds)

    def log_start(self, refresh: bool = False) -> LogStart:
        """The log start: the newest ``<path>/start/<slot>`` marker, else slot 0 / offset 0."""
        if self.start is None:
            self.segments.start_listing()  # a first use: the segment listing overlaps the log start's
        start = self.start
        if start is None or refresh:
            start = self.reread()
        return start

    def reread(self) -> LogStart:
        """Read the log start now (one LIST, and a GET of the newest marker when there is one), starting
        no segment listing: for a caller that lists the segments itself in the same round."""
        names = paths.slot_names(self.storage.list(paths.log_start(self.path)))
        start = LogStart(0, 0)
        for name in reversed(names):
            key = paths.log_start(self.path) + name
            try:
                value = envelope.read_json(self.storage, key, envelope.ObjectKind.LOG_START)
            except ObjectNotFoundError:
                continue
            start = LogStart(int(value["slot"]), int(value["offset"]), int(value.get("bytes_before", 0)))
            break
        self.start = start
        self.checked = self.monotonic()
        return start

    def recent_log_start(self, max_staleness_s: float | None = None) -> LogStart:
        """The log start, re-read (one LIST) when the cached value is older than ``max_staleness_s``
        (default: ``recheck_s()``, LOG_START_RECHECK_S)."""
        if max_staleness_s is None:
            max_staleness_s = self.recheck_s()
        now = self.monotonic()
        if self.start is None or now - self.checked >= max_staleness_s:
            self.log_start(refresh=True)
        return self.log_start()

    def log_start_for(self, offset: int) -> LogStart:
        """The recent log start (:meth:`recent_log_start`), re-read at once when ``offset`` lies below it:
        an offset is reported removed by retention only against a fresh log start."""
        start = self.recent_log_start()
        if offset < start.offset:
            start = self.log_start(refresh=True)
        return start
