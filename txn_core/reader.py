"""Reading a partition under an isolation level (PROTOCOL.md "Reading" and "Read bound").

:class:`PartitionState` keeps a partition's :class:`TxnBuffer` current (snapshot + header scan of the
tail) and lifts its log-derived max read position with the coordinator's decisions: the **read bound**
(last stable offset) is the first offset of the earliest transaction that is ongoing in this partition
*and* undecided in the transaction log. A transaction past its timeout is aborted on the spot by
:meth:`TransactionCoordinator.resolve`, so a dead producer never holds the bound longer than its timeout.

:class:`PartitionReader` delivers records: it reads whole entries into a bounded window, applies those at
or above the buffer position, and hands out, in offset order, every entry below the read bound whose
transaction committed (read_committed), or every non-control entry (read_uncommitted). Entries below a
snapshot's position are classified from the snapshot's state without being applied again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from txn_core.buffer import Disposition, TxnBuffer
from txn_core.coordinator.states import CoordinatorState
from txn_core.coordinator.txnlog import TxnStatus
from txn_core.entry import HEADER_SIZE, EntryHeader
from txn_core.errors import (
    CorruptDataError,
    DataLossError,
    ObjectNotFoundError,
    OffsetOutOfRangeError,
    TxnLogError,
)
from txn_core.ids import TxnId
from txn_core.partition import Entry, PartitionLog
from txn_core.producer_state import gap_error
from txn_core.readahead import HeaderReadAhead, ReadAhead
from txn_core.records import MetadataColumns, StagedDataMissingError, entry_table
from txn_core.snapshots import SnapshotStore
from txn_core.storage.guarded import opportunistic

READ_COMMITTED = "read_committed"
READ_UNCOMMITTED = "read_uncommitted"
ISOLATION_LEVELS = (READ_COMMITTED, READ_UNCOMMITTED)

Resolver = Callable[[TxnId], TxnStatus]
#: Entry headers a reader reads ahead for a transaction's marker before asking the transaction log.
MARKER_LOOKAHEAD = 2


class PartitionState:
    """The transaction buffer of one partition plus coordinator decisions. Not thread-safe."""

    def __init__(self, log: PartitionLog, resolver: Resolver, *, write_snapshots: bool = True) -> None:
        self.log = log
        self.resolver = resolver
        self.snapshots = SnapshotStore(log.storage, log.path, log.clock)
        self.write_snapshots = write_snapshots
        self._buffer: TxnBuffer | None = None
        self.decisions: dict[TxnId, bool] = {}
        self.snapshot_position = 0
        #: header scans of the tail read ahead (a cold open with no snapshot reads every header)
        self.headers = HeaderReadAhead(log)

    @property
    def buffer(self) -> TxnBuffer:
        if self._buffer is None:
            self._buffer = self._load()
        return self._buffer

    def _load(self) -> TxnBuffer:
        start = self.log.log_start()
        buffer = self.snapshots.load_latest(self.log.path)
        if buffer is None or buffer.position < start.offset:
            buffer = TxnBuffer(start.offset, start.slot)
            buffer.size_bytes = start.bytes_before  # size counts every entry since offset 0
        else:
            buffer.prune(start.offset)  # what retention removed since the snapshot was taken
        buffer.where = self.log.path
        self.snapshot_position = buffer.position
        return buffer

    def reload(self) -> TxnBuffer:
        """Rebuild the buffer from the newest snapshot (after retention removed what it had not seen)."""
        self._buffer = self._load()
        self.decisions.clear()
        return self._buffer

    def apply(self, slot: int, header: EntryHeader, size: int) -> Disposition:
        disposition = self.buffer.apply(slot, header, size)
        if header.is_control and header.txn is not None:
            self.decisions.pop(header.txn, None)
        return disposition

    def scan_to_end(self, *, max_entries: int | None = None) -> int:
        """Apply every entry after the buffer position, reading headers only. Returns entries applied."""
        buffer = self.buffer
        n = 0
        while max_entries is None or n < max_entries:
            try:
                header = self.headers.next(buffer.slot)
            except ObjectNotFoundError:
                if self.log.deleted(buffer.slot):
                    # Retention removed entries this buffer had not applied: restart from its snapshot.
                    buffer = self.reload()
                    continue
                break
            self.apply(buffer.slot, header, HEADER_SIZE + header.payload_len)
            n += 1
        self.maybe_snapshot()
        return n

    def maybe_snapshot(self) -> None:
        if self.write_snapshots and self._buffer is not None and self.snapshots.due(self._buffer):
            buffer = self._buffer
            opportunistic(
                self.log.storage, "buffer snapshot", lambda: self.snapshots.write(buffer, self.log.log_start().offset)
            )

    # --- decisions ------------------------------------------------------------------------------

    def decide(self, txn: TxnId) -> bool | None:
        """True committed / False aborted / None still open, for a transaction ongoing in the buffer."""
        known = self.decisions.get(txn)
        if known is not None:
            return known
        # Usually the marker is right behind the data: a few header reads beat a transaction-log lookup.
        self._scan_for_marker(txn, max_entries=MARKER_LOOKAHEAD)
        if txn not in self.buffer.by_txn:
            return self.buffer.outcome(txn) is not False
        status = self.resolver(txn)
        if status.state is None or status.state == CoordinatorState.COMPLETE_COMMIT:
            # Finished: every participant has its marker, so this partition's marker lies ahead of the
            # data -- unless the data is a zombie write that landed after the marker (whose record aged
            # out of the buffer's cache of ended transactions). Scan ahead to tell them apart.
            self._scan_for_marker(txn)
            outcome = self.buffer.outcome(txn)
            if outcome is None:
                # No marker after the data: these writes came after the transaction ended. They become
                # skip ranges (persisted, so every reader and range plan drops them the same way).
                self._drop_zombie_writes(txn)
                return True
            self.decisions[txn] = outcome
            return outcome
        if status.decided:
            # Data in a partition the transaction never registered is not part of it (the writer broke
            # the protocol); it is dropped now and after completion alike.
            committed = status.committed and (not status.participants or self.log.path in status.participants)
            self.decisions[txn] = committed
            return committed
        return None

    def _drop_zombie_writes(self, txn: TxnId) -> None:
        buffer = self.buffer
        ongoing = buffer.by_txn.get(txn)
        if ongoing is None:
            return
        entries = []
        for slot in range(self.log.slot_for_offset(ongoing.first_offset), buffer.slot):
            header = self.log.read_header(slot)
            if header.txn == txn and not header.is_control:
                entries.append((header.base_offset, header.last_offset))
        buffer.drop_incarnation(txn, entries)

    def _scan_for_marker(self, txn: TxnId, max_entries: int | None = None) -> None:
        buffer = self.buffer
        n = 0
        while txn in buffer.by_txn and (max_entries is None or n < max_entries):
            n += 1
            try:
                header = self.log.read_header(buffer.slot)
            except ObjectNotFoundError:
                return
            self.apply(buffer.slot, header, HEADER_SIZE + header.payload_len)

    def read_bound(self) -> int:
        """The last stable offset: first offset of the earliest undecided ongoing transaction."""
        buffer = self.buffer
        for first, ongoing in list(buffer.ongoing.items()):
            if ongoing.txn not in buffer.by_txn:
                continue  # ended by a marker found while deciding an earlier one
            if self.decide(ongoing.txn) is None:
                return int(first)
        return buffer.position

    def visible(self, txn: TxnId) -> bool | None:
        """Whether data of ``txn`` at an offset below the read bound is committed."""
        buffer = self.buffer
        if txn in buffer.aborted:
            return False
        if txn in buffer.by_txn:
            return self.decisions.get(txn)
        return True

    def classify(self, header: EntryHeader) -> Disposition:
        """Disposition of an entry below the buffer position (not applied again)."""
        if header.is_control:
            return Disposition.CONTROL
        buffer = self.buffer
        if header.txn is not None:
            aborted = buffer.aborted.get(header.txn)
            if aborted is not None and header.base_offset > aborted.marker_offset:
                return Disposition.ABORTED  # a zombie write after the abort marker, as apply() classed it
        if buffer.skips.covers(header.base_offset):
            return Disposition.SKIP
        if header.txn is None:
            return Disposition.DATA
        if header.txn in buffer.aborted:
            return Disposition.ABORTED
        return Disposition.TXN_DATA

    def filters(self, start: int, end: int) -> tuple[list[int], list[tuple[int, int]]]:
        """Aborted transaction keys and skip ranges a reader of ``[start, end)`` must drop.

        Includes transactions aborted by the coordinator whose marker has not reached this partition.
        """
        from txn_core.aborted import txn_key

        keys, skips = self.buffer.filters(start, end)
        for txn, committed in self.decisions.items():
            if not committed and txn in self.buffer.by_txn:
                keys.append(txn_key(txn))
        self.check_gaps(start, end, set(keys), skips)
        return keys, skips

    def check_gaps(self, start: int, end: int, aborted: set[int], skips: list[tuple[int, int]]) -> None:
        """Raise OutOfOrderSequenceError if an entry after a sequence gap in ``[start, end)`` would be read.

        Only entries of non-transactional or committed data count; the caller passes the range's filters.
        """
        from txn_core.aborted import txn_key

        for offset, gap in self.buffer.gaps.items():
            if not start <= offset < end or any(f <= offset <= last for f, last in skips):
                continue
            slot = self.log.slot_for_offset(offset)
            header = self.log.read_header(slot)
            if header.txn is not None and txn_key(header.txn) in aborted:
                continue
            raise gap_error(self.log.path, offset, *gap)


@dataclass(slots=True)
class _Slot:
    slot: int
    header: EntryHeader
    entry: Entry | None
    disposition: Disposition


class PartitionReader:
    """Delivers one partition's records from ``position`` on (see module doc)."""

    def __init__(
        self, state: PartitionState, topic: str, partition: int, isolation: str, window_bytes: int = 64 << 20
    ) -> None:
        self.state = state
        self.log = state.log
        self.topic = topic
        self.partition = partition
        self.isolation = isolation
        self.window_bytes = window_bytes
        self.position = 0
        self._cursor = 0  # next slot to read into the window
        self._window: deque[_Slot] = deque()
        self._window_size = 0
        self._error: CorruptDataError | DataLossError | None = None
        self._meta = MetadataColumns(topic, partition)
        # Entries are read ahead, the reads in flight holding at most half the window.
        self._ahead = ReadAhead(self.log, max_bytes=max(window_bytes // 2, 1))
        self._prefilled = False  # fill() ran since the last poll: the poll need not read again
        self._at_end = False  # the last fill stopped at the log end

    def seek(self, offset: int) -> None:
        """Deliver from ``offset`` on. Below the log start raises :class:`DataLossError`."""
        start = self.log.log_start_for(offset)
        if offset < start.offset:
            raise DataLossError(
                f"{self.log.path}: offset {offset} was removed by retention; the log starts at {start.offset}"
            )
        buffer = self.state.buffer
        if buffer.position < start.offset:  # retention passed this buffer: rebuild from its snapshot
            buffer = self.state.reload()
        # An offset the buffer has passed exists: no need to find the log end (a cold open from the log
        # start or a snapshot skips the tail search).
        end = self.log.end_offset() if offset > buffer.position else buffer.position
        if offset > end:
            raise OffsetOutOfRangeError(f"{self.log.path}: offset {offset} is beyond the log end {end}")
        self._window.clear()
        self._window_size = 0
        self._error = None
        self._prefilled = self._at_end = False
        self.position = offset
        if offset >= buffer.position:
            # Scan (headers only) up to the entry containing offset.
            while buffer.position <= offset and buffer.position < end:
                header = self.log.read_header(buffer.slot)
                if header.next_offset > offset:
                    break
                self.state.apply(buffer.slot, header, HEADER_SIZE + header.payload_len)
            self._cursor = buffer.slot
        else:
            self._cursor = self.log.slot_for_offset(offset)

    def wants_data(self) -> bool:
        """Whether the window is empty and no error is pending (a :meth:`fill` would read)."""
        return not self._window and self._error is None

    def fill(self) -> bool:
        """Read entries into the window up to its budget (what :meth:`poll` does first, so the next poll
        does not read again); True if anything was read. May run on another thread than :meth:`poll`,
        never at the same time."""
        self._prefilled = True
        return self._fill()

    def _fill(self) -> bool:
        """Read entries into the window up to its budget; True if anything was read."""
        buffer = self.state.buffer
        read = False
        self._at_end = False
        while self._error is None and (self._window_size < self.window_bytes or not self._window):
            self._ahead.seek(self._cursor)
            try:
                entry = self._ahead.next()
            except ObjectNotFoundError:
                self._at_end = True
                if self.log.deleted(self._cursor):
                    start = self.log.log_start()
                    self._error = DataLossError(
                        f"{self.log.path}: offsets from {self.position} up to {start.offset} were removed by "
                        f"retention while this reader was behind; seek to {start.offset} or later to go on"
                    )
                break
            except CorruptDataError as exc:
                # Deliver what precedes the damage first; then fail, and keep failing (never skip it).
                self._error = exc
                break
            header = entry.header
            if header.base_offset >= buffer.position:
                if header.base_offset != buffer.position:
                    raise CorruptDataError(
                        f"{entry.key}: starts at offset {header.base_offset}, expected {buffer.position}", entry.key
                    )
                disposition = self.state.apply(self._cursor, header, len(entry.data))
            else:
                disposition = self.state.classify(header)
            keep = (
                entry
                if disposition in (Disposition.DATA, Disposition.TXN_DATA)
                or (disposition is Disposition.ABORTED and self.isolation == READ_UNCOMMITTED)
                else None
            )
            self._window.append(_Slot(self._cursor, header, keep, disposition))
            self._window_size += len(entry.data) if keep is not None else 0
            self._cursor += 1
            read = True
        self.state.maybe_snapshot()
        return read

    def poll(self, max_records: int | None = None) -> list[pa.RecordBatch]:
        """Deliverable records from ``position`` on (at most ``max_records``), as record batches.

        An error (a sequence gap, corrupt or missing data, data loss) is raised only by a poll that has
        nothing before it to deliver: records ahead of the problem are returned first, and ``position``
        stays on the first record not returned, so a caller that handles the error and polls again
        misses nothing (PROTOCOL.md "Reading").
        """
        if not self._prefilled:
            self._fill()
        self._prefilled = False
        out: list[pa.RecordBatch] = []
        budget = max_records if max_records is not None else 1 << 62
        committed = self.isolation == "read_committed"
        bound = self.state.read_bound() if committed else 1 << 62
        while self._window and budget > 0:
            item = self._window[0]
            header = item.header
            if header.next_offset <= self.position:
                self._pop()
                continue
            if committed and header.base_offset >= bound:
                break
            d = item.disposition
            if d in (Disposition.DATA, Disposition.TXN_DATA) and self.state.buffer.skips.covers(header.base_offset):
                d = Disposition.SKIP  # found to be a zombie write after it entered the window
            deliver = d is Disposition.DATA or (d is Disposition.ABORTED and not committed)
            if d is Disposition.TXN_DATA:
                if committed:
                    v = self.state.visible(header.txn) if header.txn else True
                    if v is None:
                        break
                    deliver = v
                else:
                    deliver = True
            if not deliver or item.entry is None:
                self.position = header.next_offset
                self._pop()
                continue
            try:
                gap = self.state.buffer.gaps.get(header.base_offset)
                if gap is not None:
                    raise gap_error(self.log.path, header.base_offset, *gap)
                table = entry_table(self.log.storage, item.entry)
            except StagedDataMissingError:
                aborted = d is Disposition.ABORTED or (
                    header.txn is not None and self.state.visible(header.txn) is False
                )
                if not aborted:
                    if out:
                        break  # deliver what precedes the problem; the next poll raises it
                    raise
                # read_uncommitted: an aborted transaction's staged rows were cleaned up; nothing to show
                self.position = header.next_offset
                self._pop()
                continue
            except TxnLogError:
                if out:
                    break  # deliver what precedes the problem; the next poll raises it
                raise  # the position stays on the first undelivered record
            skip = self.position - header.base_offset
            take = min(table.num_rows - skip, budget)
            part = table.slice(skip, take)
            first = header.base_offset + skip
            out.extend(self._meta.add(b, first + o, header.timestamp_ms) for b, o in _batches_with_offsets(part))
            budget -= take
            self.position = first + take
            if self.position >= header.next_offset:
                self._pop()
        if not self._window and not out and not self._at_end:
            self._fill()  # the window drained without a record to deliver: read on (not past the log end)
        if not out and self._error is not None and not self._window:
            raise self._error
        return out

    def _pop(self) -> None:
        item = self._window.popleft()
        if item.entry is not None:
            self._window_size -= len(item.entry.data)

    def lag_info(self) -> tuple[int, int]:
        """(read bound, log end) as of now."""
        bound = self.state.read_bound() if self.isolation == "read_committed" else self.state.buffer.position
        return bound, self.log.end_offset()


def _batches_with_offsets(table: pa.Table) -> list[tuple[pa.RecordBatch, int]]:
    out = []
    offset = 0
    for batch in table.to_batches():
        if batch.num_rows:
            out.append((batch, offset))
            offset += batch.num_rows
    return out
