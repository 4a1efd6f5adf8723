"""The log's format object, ``_txnlog/format`` (PROTOCOL.md "Layout"): read, or created, once per ``Log``.

A log's root holds one format object: ``{"format": "txnlog", "version", "coordinator_partitions",
"created_ms"}``, created once (create-if-absent: of racing creators one wins and all read its value) and
never changed. Every client of the log needs it before it writes (a location that is not a txnlog is
refused before anything is written there) and before it reports anything (an error about the location
comes before any other); only the transaction log needs its value (the coordinator partition count).

On a store whose requests are round trips (``Storage.overlap_reads``) :class:`LogFormat` starts its read
at once and a reader's first round of requests (topic metadata, partition listings) overlaps it, waiting
for it (:meth:`LogFormat.check`) before it reports anything; on local disk the read is made at once, as
cheap as a hand-off. Invariant: nothing is written to the location and nothing read there is reported
until :meth:`LogFormat.check` has returned.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

from txn_core.clock import Clock
from txn_core.errors import ConfigurationError, ObjectNotFoundError
from txn_core.format import envelope, paths
from txn_core.storage.base import Storage
from txn_core.storage.parallel import submit

FORMAT_VERSION = 1
DEFAULT_COORDINATOR_PARTITIONS = 16

#: What the root of a log holds (PROTOCOL.md "Layout"); anything else there means it is someone else's.
LOG_TOP_LEVEL = frozenset({"_txnlog/", "topics/", "groups/", "subscriptions/", "staging/", "segments/"})


def _read(storage: Storage) -> dict[str, Any] | None:
    """The format object's value, or None when there is none."""
    try:
        return envelope.read_json(storage, paths.FORMAT_KEY, envelope.ObjectKind.FORMAT)
    except ObjectNotFoundError:
        return None


class LogFormat:
    """The format object of one ``Log`` (see module doc). Thread-safe; :meth:`check` settles it once."""

    def __init__(
        self,
        storage: Storage,
        clock: Clock,
        *,
        create: bool,
        allow_non_empty: bool,
        coordinator_partitions: int = DEFAULT_COORDINATOR_PARTITIONS,
    ) -> None:
        if not 1 <= coordinator_partitions <= 4096:
            raise ConfigurationError(f"coordinator_partitions must be in [1, 4096], got {coordinator_partitions}")
        self.storage = storage
        self.clock = clock
        self.create = create
        self.allow_non_empty = allow_non_empty
        self.wanted_partitions = coordinator_partitions
        self._lock = threading.Lock()
        self._partitions: int | None = None
        self._reading: Future[dict[str, Any] | None] | None = None
        if storage.overlap_reads:
            self._reading = submit(_read, storage)
        else:
            self.check()

    def check(self) -> None:
        """Wait for the format object (creating it when the log is new and ``create``); raise
        :class:`ConfigurationError` naming the problem and the fix when the location holds no txnlog, holds
        other files, or holds a newer format. Cheap once it has returned."""
        if self._partitions is not None:
            return
        with self._lock:
            if self._partitions is None:
                self._partitions = self._settle()

    @property
    def coordinator_partitions(self) -> int:
        """The log's own coordinator partition count (waits for :meth:`check`)."""
        self.check()
        assert self._partitions is not None
        return self._partitions

    def _settle(self) -> int:
        reading, self._reading = self._reading, None
        if reading is not None and reading.cancel():
            reading = None  # never started (the pool is busy): read here rather than wait for a thread
        value = reading.result() if reading is not None else _read(self.storage)
        if value is None:
            value = self._create()
        if value.get("format") != "txnlog" or int(value.get("version", 0)) > FORMAT_VERSION:
            raise ConfigurationError(
                f"{self.storage.describe()} holds a txnlog of format version {value.get('version')}; this "
                f"txnlog reads version {FORMAT_VERSION}. Upgrade txnlog."
            )
        return int(value["coordinator_partitions"])

    def _create(self) -> dict[str, Any]:
        """Create the format object of a new log (of racing creators one wins; all read its value)."""
        if not self.create:
            # a lookup of one object cannot tell a missing bucket from a missing log; a listing of the
            # log's own directory can, and a missing bucket raises its own error naming the fix
            paths.has_log(self.storage)
            raise ConfigurationError(
                f"no txnlog at {self.storage.url} (it has no {paths.FORMAT_KEY}): check the URL and the storage "
                "options; a reader never creates a log (producers and txn_core.open_log do)"
            )
        if not self.allow_non_empty:
            foreign = [n for n in self.storage.list("") if n not in LOG_TOP_LEVEL]
            if foreign:
                shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
                raise ConfigurationError(
                    f"{self.storage.url} is not a txnlog log but holds other files ({shown}); refusing to "
                    "create a log beside them. Use an empty directory or prefix, or opt in with "
                    "open_log(..., allow_non_empty=True) (Spark sink: option allowNonEmptyPath=true)."
                )
        envelope.create_json(
            self.storage,
            paths.FORMAT_KEY,
            envelope.ObjectKind.FORMAT,
            {
                "format": "txnlog",
                "version": FORMAT_VERSION,
                "coordinator_partitions": self.wanted_partitions,
                "created_ms": self.clock(),
            },
        )
        return envelope.read_json(self.storage, paths.FORMAT_KEY, envelope.ObjectKind.FORMAT)
