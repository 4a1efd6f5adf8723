"""Transaction-buffer snapshots, split over several parts (PROTOCOL.md "Snapshots"; Pulsar PIP-196 and
seed 003).

A snapshot of a partition's :class:`TxnBuffer` at ``position`` is:

* zero or more **parts**: ``<path>/snapshots/parts/<020d first marker>-<020d last marker>``, Arrow tables
  of aborted transactions ordered by abort-marker offset, each at most :data:`PART_ROWS` rows. Parts
  are immutable and shared by later snapshots: a new snapshot only seals the rows added since;
* one **final** object: ``<path>/snapshots/<020d position>``, JSON holding the max read position, the
  ongoing transactions, the unsealed aborted rows, skip ranges, producer states, and the list of parts
  with their row counts and checksums. It is written last.

A snapshot exists only once its final object does, and every part it lists is verified against the
checksum the final object records, so a half-written snapshot (crash between parts) is never used:
the reader falls back to the previous snapshot, and to a replay from the log start only if none is
valid. Rebuilding costs the parts plus the log tail after ``position``, never the whole partition.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Future, wait
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from txn_core.clock import Clock
from txn_core.errors import CorruptDataError, ObjectExistsError, ObjectNotFoundError
from txn_core.format import envelope, paths
from txn_core.format.arrays import from_numpy, to_numpy
from txn_core.format.checksum import crc32c
from txn_core.format.entry import encode_arrow
from txn_core.logs import get_logger
from txn_core.partition.aborted import ABORTED_SCHEMA, AbortedIndex, SkipRanges, key_txn, txn_key
from txn_core.partition.buffer import OngoingTxn, TxnBuffer
from txn_core.partition.sequences import ProducerStates
from txn_core.storage.base import Storage, create_resolving
from txn_core.storage.parallel import submit

logger = get_logger(__name__)

FORMAT_VERSION = 1
#: Rows per sealed part.
PART_ROWS = 100_000
#: Take a snapshot after this many transactions ended since the last one...
SNAPSHOT_EVERY_TXNS = 500
#: ...or this many entries were applied (so opening a partition that sees no transactions reads at most
#: this many headers past its newest snapshot)...
SNAPSHOT_EVERY_ENTRIES = 1_000
#: ...or after this long, if a transaction ended or ``SNAPSHOT_MIN_ENTRIES`` entries were applied.
SNAPSHOT_EVERY_MS = 60_000
SNAPSHOT_MIN_ENTRIES = 100
#: Final objects kept per partition.
SNAPSHOTS_KEPT = 3
#: Ended-transaction outcomes kept in a snapshot (the zombie-write cache of TxnBuffer.ended).
ENDED_KEPT = 10_000

#: Snapshot writes of this process running behind their readers, by (storage URL, snapshots prefix).
_writing: dict[tuple[str, str], Future[object]] = {}
_writing_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class PartRef:
    key: str
    rows: int
    crc: int
    first_marker: int
    last_marker: int

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "rows": self.rows,
            "crc": self.crc,
            "first_marker": self.first_marker,
            "last_marker": self.last_marker,
        }

    @classmethod
    def from_json(cls, v: dict[str, Any]) -> PartRef:
        return cls(v["key"], int(v["rows"]), int(v["crc"]), int(v["first_marker"]), int(v["last_marker"]))


class SnapshotStore:
    """Reads and writes the buffer snapshots of one partition log."""

    def __init__(self, storage: Storage, path: str, *, clock: Clock) -> None:
        self.storage = storage
        self.path = path
        self.clock = clock
        self.prefix = paths.buffer_snapshots(path)
        self.last_position = -1
        self.last_time_ms = 0
        #: Parts and the marker offset they are sealed through, per buffer (kept with the buffer).
        self.parts: list[PartRef] = []
        self.sealed_through = -1
        self._listed: list[int] | None = None  # a listing of the finals made ahead (list_ahead), used once
        self._pending: Future[object] | None = None  # a write behind a reader (write_behind)

    def finals(self) -> list[int]:
        """The positions of the final objects listed now, after any write of this process in flight to this
        partition's snapshots has finished (:meth:`write_behind`): a process sees its own snapshots."""
        with _writing_lock:
            pending = _writing.get((self.storage.url, self.prefix))
        if pending is not None:
            wait([pending])
        return self._list_finals()

    def _list_finals(self) -> list[int]:
        return [int(name) for name in paths.slot_names(self.storage.list(self.prefix))]

    def settle(self, timeout_s: float = 10.0) -> None:
        """Wait (up to ``timeout_s``) for the write this store began behind a reader, if any: a closing
        reader leaves nothing being written. Its failure is not raised (a snapshot is only a shortcut)."""
        pending = self._pending
        if pending is not None:
            wait([pending], timeout=timeout_s)

    def writing(self) -> bool:
        """Whether a write this store began behind a reader (:meth:`write_behind`) is still running."""
        return self._pending is not None and not self._pending.done()

    def write_behind(self, buffer: TxnBuffer, log_start: int, write: Callable[[TxnBuffer], object]) -> None:
        """Run ``write(copy)`` on a copy of ``buffer`` on the shared pool, so that the reader that took the
        snapshot goes on delivering (PROTOCOL.md "Snapshots": a reader writes nothing on the path to its
        records). The buffer's counters restart now; one such write runs at a time per store (:meth:`due`
        says no meanwhile), and this process's next listing of the finals waits for it (:meth:`finals`)."""
        copy = buffer.copy()
        copy.ended_since_snapshot, copy.entries_since_snapshot = (
            buffer.ended_since_snapshot,
            buffer.entries_since_snapshot,
        )
        buffer.ended_since_snapshot = 0
        buffer.entries_since_snapshot = 0
        key = (self.storage.url, self.prefix)
        pending = submit(write, copy)
        self._pending = pending
        with _writing_lock:
            _writing[key] = pending

        def forget(done: Future[object]) -> None:
            with _writing_lock:
                if _writing.get(key) is done:
                    del _writing[key]

        pending.add_done_callback(forget)

    def list_ahead(self) -> None:
        """List the final objects now for the next :meth:`load_latest` (a reader's open lists them in the
        same round as its log start and segments)."""
        self._listed = self.finals()

    # --- write ----------------------------------------------------------------------------------

    def due(self, buffer: TxnBuffer, now_ms: int | None = None) -> bool:
        if buffer.position <= self.last_position or self.writing():
            return False
        if (
            buffer.ended_since_snapshot >= SNAPSHOT_EVERY_TXNS
            or buffer.entries_since_snapshot >= SNAPSHOT_EVERY_ENTRIES
        ):
            return True
        now_ms = self.clock() if now_ms is None else now_ms
        changed = bool(buffer.ended_since_snapshot) or buffer.entries_since_snapshot >= SNAPSHOT_MIN_ENTRIES
        return changed and now_ms - self.last_time_ms >= SNAPSHOT_EVERY_MS

    def write(self, buffer: TxnBuffer, log_start: int = 0) -> int:
        """Write a snapshot of ``buffer`` (parts first, final last); returns its position. A buffer that
        skipped a damaged entry nobody marked lost is refused: others must not inherit that choice."""
        if buffer.skipped_unmarked:
            raise ValueError(f"{self.path}: a buffer that skipped unmarked damage is never snapshotted")
        buffer.prune(log_start)
        table = buffer.aborted.to_table()
        markers = to_numpy(table.column("marker")) if table.num_rows else None
        parts = [p for p in self.parts if p.last_marker >= log_start]
        start = 0
        if markers is not None and self.sealed_through >= 0:
            start = int((markers <= self.sealed_through).sum())
        # Seal complete parts of the unsealed rows.
        while markers is not None and table.num_rows - start >= PART_ROWS:
            chunk = table.slice(start, PART_ROWS)
            first_m, last_m = int(markers[start]), int(markers[start + PART_ROWS - 1])
            key = f"{self.prefix}parts/{first_m:020d}-{last_m:020d}"
            payload = encode_arrow(chunk.to_batches(), ABORTED_SCHEMA)
            header, body = envelope.encode(envelope.ObjectKind.BUFFER_SNAPSHOT_PART, payload, is_arrow=True)
            with contextlib.suppress(ObjectExistsError):
                # An existing part holds the same rows (sealed by another participant): verified on load.
                create_resolving(self.storage, key, [header, body], header)
            parts.append(PartRef(key, PART_ROWS, _crc_of_rows(chunk), first_m, last_m))
            start += PART_ROWS
            self.sealed_through = last_m
        tail = table.slice(start)
        final = {
            "version": FORMAT_VERSION,
            "position": buffer.position,
            "slot": buffer.slot,
            "max_read_position": buffer.max_read_position,
            "log_start": log_start,
            "parts": [p.to_json() for p in parts],
            "aborted": [tail.column(c).to_pylist() for c in ABORTED_SCHEMA.names],
            "ongoing": [
                [txn_key(o.txn), o.first_offset, o.last_offset, o.producer_id, o.producer_epoch, o.entries, o.first_ms]
                for o in buffer.ongoing.values()
            ],
            "ended": [[txn_key(t), int(c), m] for t, (c, m) in list(buffer.ended.items())[-ENDED_KEPT:]],
            "skips": buffer.skips.to_list(),
            "gaps": [[o, *g] for o, g in sorted(buffer.gaps.items())],
            "producers": buffer.producers.to_list(),
            "resync": sorted(buffer.producers.resync),
            "lost_outcomes": [[txn_key(t), o] for t, o in buffer.lost_outcomes.items()],
            "log_time_ms": buffer.log_time_ms,
            "size_bytes": buffer.size_bytes,
            "committed_count": buffer.committed_count,
            "aborted_count": buffer.aborted_count,
            "time_ms": self.clock(),
        }
        key = self.prefix + paths.slot_name(buffer.position)
        if envelope.create_json(self.storage, key, envelope.ObjectKind.BUFFER_SNAPSHOT, final):
            logger.info("snapshot %s written", key)  # else another participant wrote this position's snapshot
        self.parts = parts
        self.last_position = buffer.position
        self.last_time_ms = int(str(final["time_ms"]))
        buffer.ended_since_snapshot = 0
        buffer.entries_since_snapshot = 0
        self._cleanup()
        return buffer.position

    def _cleanup(self) -> None:
        finals = self._list_finals()
        for pos in finals[:-SNAPSHOTS_KEPT]:
            self.storage.delete(self.prefix + paths.slot_name(pos))
        keep: set[str] = set()
        for pos in finals[-SNAPSHOTS_KEPT:]:
            try:
                value = envelope.read_json(
                    self.storage, self.prefix + paths.slot_name(pos), envelope.ObjectKind.BUFFER_SNAPSHOT
                )
            except (ObjectNotFoundError, CorruptDataError):
                continue
            keep.update(p["key"] for p in value["parts"])
        for name in self.storage.list(self.prefix + "parts/"):
            key = f"{self.prefix}parts/{name}"
            if key not in keep and finals:
                self.storage.delete(key)

    # --- load -----------------------------------------------------------------------------------

    def load_latest(self, where: str = "", *, at_most: int | None = None) -> TxnBuffer | None:
        """The newest valid snapshot (at a position of at most ``at_most`` when given) as a buffer, or None
        (then replay from the log start)."""
        listed, self._listed = self._listed, None
        for pos in reversed(listed if listed is not None else self.finals()):
            if at_most is not None and pos > at_most:
                continue
            try:
                return self.load(pos, where)
            except (ObjectNotFoundError, CorruptDataError) as exc:
                logger.warning("%s: snapshot at %d is unusable (%s); trying an older one", where, pos, exc)
        return None

    def load(self, position: int, where: str = "") -> TxnBuffer:
        key = self.prefix + paths.slot_name(position)
        value = envelope.read_json(self.storage, key, envelope.ObjectKind.BUFFER_SNAPSHOT)
        if value.get("version") != FORMAT_VERSION:
            raise CorruptDataError(f"{key}: snapshot format {value.get('version')} is not supported", key)
        parts = [PartRef.from_json(p) for p in value["parts"]]
        tables = []
        for p in parts:
            env = envelope.decode(self.storage.read(p.key), p.key, envelope.ObjectKind.BUFFER_SNAPSHOT_PART)
            t = env.arrow(p.key)
            if t.num_rows != p.rows or _crc_of_rows(t) != p.crc:
                raise CorruptDataError(f"{p.key}: part does not match snapshot {key} (rows or checksum)", p.key)
            tables.append(t)
        cols = value["aborted"]
        if cols and cols[0]:
            tables.append(
                pa.table(
                    [
                        from_numpy(cols[0], pa.uint64()),
                        from_numpy(cols[1], pa.int64()),
                        from_numpy(cols[2], pa.int64()),
                        from_numpy(cols[3], pa.int64()),
                    ],
                    schema=ABORTED_SCHEMA,
                )
            )
        buffer = TxnBuffer(int(value["position"]), int(value["slot"]))
        buffer.where = where
        buffer.aborted = AbortedIndex.from_tables(tables)
        for k, first, last, pid, epoch, entries, *since in value["ongoing"]:  # first_ms: newer snapshots only
            first_ms = int(since[0]) if since and since[0] is not None else None
            o = OngoingTxn(key_txn(int(k)), int(first), int(last), int(pid), int(epoch), int(entries), first_ms)
            buffer.ongoing[o.first_offset] = o
            buffer.by_txn[o.txn] = o
        for k, committed, marker in value.get("ended", []):
            buffer.ended[key_txn(int(k))] = (bool(committed), int(marker))
        buffer.skips = SkipRanges.from_list(value["skips"])
        buffer.gaps = {int(o): (int(a), int(b), int(c), int(d)) for o, a, b, c, d in value.get("gaps", [])}
        buffer.producers = ProducerStates.from_list(value["producers"])
        buffer.producers.resync = {int(p) for p in value.get("resync", [])}
        buffer.lost_outcomes = {key_txn(int(k)): o for k, o in value.get("lost_outcomes", [])}
        buffer.log_time_ms = int(value.get("log_time_ms", max((r[3] for r in value["producers"]), default=0)))
        buffer.size_bytes = int(value["size_bytes"])
        buffer.committed_count = int(value["committed_count"])
        buffer.aborted_count = int(value["aborted_count"])
        if buffer.max_read_position != int(value["max_read_position"]):
            raise CorruptDataError(f"{key}: max read position does not match its ongoing transactions", key)
        self.parts = parts
        self.sealed_through = parts[-1].last_marker if parts else -1
        self.last_position = buffer.position
        self.last_time_ms = int(value["time_ms"])
        return buffer


def _crc_of_rows(table: pa.Table) -> int:
    crc = 0
    for name in ABORTED_SCHEMA.names:
        arr = table.column(name).combine_chunks()
        crc = crc32c(memoryview(arr.buffers()[1]).cast("B")[arr.offset * 8 : (arr.offset + len(arr)) * 8], crc)
    return crc
