"""Reading a partition under an isolation level (PROTOCOL.md "Reading" and "Read bound").

:class:`PartitionReader` delivers records: it reads whole entries into a bounded window, applies those at
or above the buffer position to its :class:`~txn_core.partition.state.PartitionState`, and hands out, in
offset order, every entry below the read bound whose transaction committed (read_committed), or every
non-control entry (read_uncommitted). Entries below a snapshot's position are classified from the
snapshot's state without being applied again.

Damage (PROTOCOL.md "Damage"): a reader delivers everything before a damaged entry and then raises
:class:`DamagedEntryError`, at every poll, until it is marked lost or restored; offsets marked lost are
passed over with a warning, and a reader made with ``skip_damaged=True`` also passes damage nobody marked.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from txn_core.errors import (
    CorruptDataError,
    DamagedEntryError,
    DataLossError,
    ObjectNotFoundError,
    OffsetOutOfRangeError,
    TxnLogError,
)
from txn_core.format.entry import HEADER_SIZE, EntryHeader, EntryKind
from txn_core.format.ipcrun import MAX_RUN_BYTES, byte_view, decode_run, spliceable
from txn_core.logs import get_logger
from txn_core.partition.buffer import Disposition
from txn_core.partition.fetch import span_entry
from txn_core.partition.lost import LostEntry
from txn_core.partition.partition import Entry, LogStart, entry_of_lost
from txn_core.partition.readahead import ReadAhead
from txn_core.partition.records import MetadataColumns, StagedDataMissingError, entry_table
from txn_core.partition.runs import MIN_RUN, Run, decode, merged, plan_delivery, run_length
from txn_core.partition.sequences import gap_error
from txn_core.partition.skipping import lost_records, unreadable_records, warn_skipped
from txn_core.partition.state import PartitionState
from txn_core.storage.parallel import inline_leaves

READ_COMMITTED = "read_committed"
READ_UNCOMMITTED = "read_uncommitted"
ISOLATION_LEVELS = (READ_COMMITTED, READ_UNCOMMITTED)

logger = get_logger(__name__)


@dataclass(slots=True)
class _Slot:
    slot: int
    header: EntryHeader
    entry: Entry | None
    disposition: Disposition
    lost: LostEntry | None = None  # why its records are passed over (disposition LOST)
    batch: pa.RecordBatch | None = None  # its records, decoded with a run of entries (:meth:`_decode_run`)
    tried: bool = False  # a run including it was decoded (or could not be): decode it alone


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
        self._expected: int | None = None  # base offset of the entry at _cursor (None: the one holding position)
        self._window: deque[_Slot | Run] = deque()  # entries one by one, or runs of a segment's (runs.py)
        self._window_size = 0
        self._error: CorruptDataError | DataLossError | None = None
        self._meta = MetadataColumns(topic, partition)
        # Entries are read ahead, the reads in flight holding at most half the window.
        self._ahead = ReadAhead(self.log, max_bytes=max(window_bytes // 2, 1))
        # Reads from a store whose reads are copies out of the page cache (local disk) run on the reading
        # thread: handed to pool threads they only contend for the interpreter (as ranges.read_range does).
        self._inline = not self.log.storage.overlap_reads
        self._prefilled = False  # fill() ran since the last poll: the poll need not read again
        self._waiting: set[int] = set()  # damaged last entries a skip_damaged reader waits at (warned once)
        self._at_end = False  # the last fill stopped at the log end

    @property
    def skip_damaged(self) -> bool:
        return self.state.skip_damaged

    def read_ahead_from(self, slot: int) -> None:
        """Start reading the entries from ``slot`` now, before the buffer is loaded: a reader about to start at
        ``slot`` (a fresh one at the log start) gets its first entries in the round of its buffer snapshot
        instead of the round after. A seek that lands elsewhere drops them. Local disk reads run on the
        reading thread, later, as always."""
        if not self._inline:
            self._ahead.start(slot)

    def seek(self, offset: int) -> None:
        """Deliver from ``offset`` on. Below the log start raises :class:`DataLossError`; past a damaged
        entry the buffer cannot pass, its :class:`DamagedEntryError`. A seek that raises changes nothing.

        The log start is the one this process learned a moment ago (:meth:`PartitionLog.log_start_for`);
        an entry the scan needs that retention removed since is a reason to ask again, not an error: the
        seek is retried once against the fresh log start (rebuilding the buffer past what was removed)."""
        try:
            self._seek(offset, self.log.log_start_for(offset))
        except ObjectNotFoundError:
            self._seek(offset, self.log.log_start(refresh=True))

    def _seek(self, offset: int, start: LogStart) -> None:
        if offset < start.offset:
            raise DataLossError(
                f"{self.log.path}: offset {offset} was removed by retention; the log starts at {start.offset}"
            )
        buffer = self.state.buffer
        if buffer.position < start.offset:  # retention passed this buffer: rebuild from its snapshot
            buffer = self.state.reload()
        # An offset the buffer has passed exists: no need to find the log end (a cold open from the log
        # start or a snapshot skips the tail search).
        end = self.log.readable_end() if offset > buffer.position else buffer.position
        if offset > end:
            raise OffsetOutOfRangeError(f"{self.log.path}: offset {offset} is beyond the log end {end}")
        # Find the slot first: a seek that fails (damage, storage) leaves this reader as it was.
        if offset >= buffer.position:
            # Scan (headers only, read ahead) up to the entry containing offset.
            while buffer.position <= offset and buffer.position < end:
                step = self.state.next_entry(self.state.headers.next)
                if step is None:
                    damage = self.state.damage
                    if damage is not None and buffer.position < offset:
                        raise damage  # the buffer cannot know what lies past it
                    break
                header, lost = step
                if header.next_offset > offset:
                    break
                self.state.apply(buffer.slot, header, HEADER_SIZE + header.payload_len, lost)
            cursor = buffer.slot
        else:
            # the log start needs no tail search (a fresh reader of a partition's history)
            cursor = start.slot if offset == start.offset else self.log.slot_for_offset(offset)
        self._window.clear()
        self._expected = None
        self._window_size = 0
        self._error = None
        self._prefilled = self._at_end = False
        self.position = offset
        self._cursor = cursor

    def _misplaced(self, entry: Entry) -> CorruptDataError | None:
        """The error for an entry whose offsets do not continue the previous entry's (or, first after a seek,
        do not hold the position): another object copied over this slot's. Entries below the buffer's
        snapshot are not checked against the buffer, so without this its records would be passed over or
        delivered at offsets that are not theirs."""
        header, expected = entry.header, self._expected
        if expected is None:
            if header.base_offset <= self.position < header.next_offset or header.base_offset == self.position:
                return None
            want = f"the entry holding offset {self.position}"
        elif header.base_offset == expected:
            return None
        else:
            want = f"the entry starting at offset {expected}"
        return CorruptDataError(
            f"{entry.key} holds offsets [{header.base_offset}, {header.next_offset}), not {want} as its slot "
            "should: the object is another entry's (copied over it?). Restore this slot's own object from a copy",
            entry.key,
            "offsets do not continue the previous entry's",
        )

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
                with inline_leaves(self._inline):
                    if self.isolation == READ_COMMITTED and self._take_run():
                        read = True
                        continue
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
            except DamagedEntryError as exc:
                if self._cursor == buffer.slot:
                    exc.first_offset = buffer.position
                lost = self.state.skipped(exc)
                if lost is None and self.skip_damaged:
                    # Its offsets are unknown (the last entry): nothing after it to skip to. Wait there.
                    if self._cursor not in self._waiting:
                        self._waiting.add(self._cursor)
                        logger.warning("%s; this reader skips damage but waits: its offsets are unknown", exc)
                    self._at_end = True
                    break
                if lost is None:
                    # Deliver what precedes the damage first; then fail, and keep failing (never skip it).
                    self._error = exc
                    break
                entry = entry_of_lost(lost, exc.header)
            except CorruptDataError as exc:
                self._error = exc
                break
            header = entry.header
            misplaced = self._misplaced(entry)
            if misplaced is not None:
                self._error = misplaced
                break
            self._expected = header.next_offset
            if header.base_offset >= buffer.position:
                if header.base_offset != buffer.position:
                    raise CorruptDataError(
                        f"{entry.key}: starts at offset {header.base_offset}, expected {buffer.position}", entry.key
                    )
                disposition = self.state.apply(self._cursor, header, HEADER_SIZE + header.payload_len, entry.lost)
            else:
                disposition = self.state.classify(header)
            if entry.lost is not None:
                disposition = Disposition.LOST  # its header may be intact: the buffer applied it, no records
            keep = (
                entry
                if disposition in (Disposition.DATA, Disposition.TXN_DATA)
                or (disposition is Disposition.ABORTED and self.isolation == READ_UNCOMMITTED)
                else None
            )
            self._window.append(_Slot(self._cursor, header, keep, disposition, entry.lost))
            self._window_size += entry.nbytes if keep is not None else 0
            self._cursor += 1
            read = True
        return read

    def poll(self, max_records: int | None = None) -> list[pa.RecordBatch]:
        """Deliverable records from ``position`` on (at most ``max_records``), as record batches.

        An error (a sequence gap, corrupt or missing data, data loss) is raised only by a poll that has
        nothing before it to deliver: records ahead of the problem are returned first, and ``position``
        stays on the first record not returned, so a caller that handles the error and polls again
        misses nothing (PROTOCOL.md "Reading").
        """
        if isinstance(self._error, DamagedEntryError):
            self._error = None  # read it again: it may have been marked lost or restored since
        if not self._prefilled:
            self._fill()
        self._prefilled = False
        # records, their first offset, their append time; or records with metadata columns (a run's)
        out: list[tuple[pa.RecordBatch, int, int] | pa.RecordBatch] = []
        budget = max_records if max_records is not None else 1 << 62
        committed = self.isolation == "read_committed"
        bound = self.state.read_bound() if committed else 1 << 62
        while self._window and budget > 0:
            item = self._window[0]
            if isinstance(item, Run):
                got = self._poll_run(item, budget, bound, out)
                if got is None:
                    break
                budget -= got
                continue
            header = item.header
            if header.next_offset <= self.position:
                self._pop()
                continue
            if committed and header.base_offset >= bound:
                break
            d = item.disposition
            if d is Disposition.LOST:
                self._pass_lost(item.lost or self.log.lost_entry(item.slot))
                continue
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
                if not item.tried and item.entry.header.kind == EntryKind.DATA:
                    self._decode_run()
                table = item.batch if item.batch is not None else entry_table(self.log.storage, item.entry)
            except CorruptDataError as exc:
                aborted = isinstance(exc, StagedDataMissingError) and (
                    d is Disposition.ABORTED or (header.txn is not None and self.state.visible(header.txn) is False)
                )
                if aborted:
                    # read_uncommitted: an aborted transaction's staged rows were cleaned up; nothing to show
                    self.position = header.next_offset
                    self._pop()
                    continue
                lost = lost_records(self.log, item.slot, header, exc, skip=self.skip_damaged)
                if lost is None:
                    if out:
                        break  # deliver what precedes the problem; the next poll raises it
                    error = unreadable_records(self.log, item.entry, exc)
                    if error is exc:
                        raise
                    raise error from exc
                self._pass_lost(lost)
                continue
            except TxnLogError:
                if out:
                    break  # deliver what precedes the problem; the next poll raises it
                raise  # the position stays on the first undelivered record
            skip = self.position - header.base_offset
            take = min(table.num_rows - skip, budget)
            part = table.slice(skip, take)
            first = header.base_offset + skip
            out.extend((b, first + o, header.timestamp_ms) for b, o in _batches_with_offsets(part))
            budget -= take
            self.position = first + take
            if self.position >= header.next_offset:
                self._pop()
        if not self._window and not out and not self._at_end:
            self._fill()  # the window drained without a record to deliver: read on (not past the log end)
        # A damaged entry is reported as soon as nothing before it can be delivered, records that wait on
        # an undecided transaction included: that transaction's marker may be the damaged entry.
        if not out and self._error is not None and (not self._window or isinstance(self._error, DamagedEntryError)):
            raise self._error
        # A snapshot of what was applied is written behind the records, never before them (PROTOCOL.md
        # "Snapshots"): the caller has them while it is written, and a read-only store costs nothing.
        self.state.maybe_snapshot(behind=True)
        return self._meta.add_many(out)

    def _decode_run(self) -> None:
        """Decode the window's small DATA entries from its first on in one Arrow read (:mod:`~txn_core.format.
        ipcrun`), up to :data:`MAX_RUN_BYTES`; an entry the run cannot take ends it (its payload failing its
        checksum included: decoded alone later, it raises there). Entries decoded, or tried, are marked."""
        items: list[_Slot] = []
        payloads: list[memoryview] = []
        size = 0
        for item in self._window:
            if isinstance(item, Run):
                break
            entry = item.entry
            if entry is None:
                continue
            if item.tried or entry.header.kind != EntryKind.DATA or entry.lost is not None:
                break
            try:
                payload = byte_view(entry.payload())
            except CorruptDataError:
                break
            if not spliceable(payload) or size + len(payload) > MAX_RUN_BYTES:
                break
            items.append(item)
            payloads.append(payload)
            size += len(payload)
        batches = decode_run(payloads, [item.header.record_count for item in items])
        for n, item in enumerate(items):
            item.tried = True
            if batches is not None:
                item.batch = batches[n]
        head = self._window[0] if self._window else None
        if isinstance(head, _Slot) and not items:
            head.tried = True

    def _pass_lost(self, lost: LostEntry | None) -> None:
        """Move past the window's first entry, whose records are gone, saying so."""
        item = self._window[0]
        assert isinstance(item, _Slot)
        header = item.header
        if lost is not None and self.position < header.next_offset:
            warn_skipped(lost)
        self.position = header.next_offset
        self._pop()

    def _pop(self) -> None:
        item = self._window.popleft()
        if isinstance(item, Run):
            self._window_size -= item.nbytes()
        elif item.entry is not None:
            self._window_size -= item.entry.nbytes

    def _take_run(self) -> bool:
        """Take the next entries into the window as one :class:`Run` when they were read from a segment and
        :func:`run_length` allows (the cursor and expected offset move past them); False: take the next
        entry alone. Raises what reading the next entry raises."""
        got = self._ahead.peek_span()
        if got is None:
            return False
        span, i = got
        room = max(self.window_bytes - self._window_size, 0)
        n = run_length(span, i, self._expected, self.position, room)
        buffer = self.state.buffer
        bases = span.rows["base_offset"][i : i + n]
        below = int(np.searchsorted(bases, buffer.position, side="left"))  # classified, never applied again
        if below < n and (int(bases[below]) != buffer.position or buffer.slot != span.first + i + below):
            n = below  # the entry-by-entry path raises what is wrong there
        if n < MIN_RUN:
            return False
        first = span.first + i
        for slot, header in enumerate(span.index.entry_headers(first + below, first + n), first + below):
            self.state.apply(slot, header, HEADER_SIZE + header.payload_len, None)
        self._ahead.skip_span(n)
        run = Run(span, i, i + n)
        self._window.append(run)
        self._window_size += run.nbytes()
        last = span.rows[i + n - 1]
        self._expected = int(last["base_offset"]) + int(last["record_count"])
        self._cursor += n
        return True

    def _poll_run(
        self, run: Run, budget: int, bound: int, out: list[tuple[pa.RecordBatch, int, int] | pa.RecordBatch]
    ) -> int | None:
        """Deliver what ``run`` (the window's first item) delivers now into ``out`` (:func:`plan_delivery`);
        the records delivered, or None when the poll must stop (the read bound, an undecided transaction).
        An entry the run does not decide is handed to the entry-by-entry path (:meth:`_alone`)."""
        plan = plan_delivery(run, self.state.buffer, self.state.decisions.get, self.position, bound, budget)
        batches = decode(run, plan.deliver) if len(plan.deliver) else []
        passed, then = plan.passed, plan.then
        if len(batches) < len(plan.deliver):
            passed, then = int(plan.deliver[len(batches)]), "alone"  # it fails its checks: raised entry by entry
        rows = run.span.rows[run.i : run.i + passed]
        delivered = 0
        together = merged(self._meta, rows, plan.deliver, batches) if len(batches) > 1 else None
        if together is not None:  # one batch per entry: merged, metadata built at once
            out.extend(together)
            delivered = sum(b.num_rows for b in together)
        else:
            bases, times_ms = rows["base_offset"].tolist(), rows["timestamp_ms"].tolist()
            for n, got in zip(plan.deliver.tolist(), batches, strict=False):
                offset = bases[n]
                for batch in got:
                    out.append((batch, offset, times_ms[n]))
                    offset += batch.num_rows
                delivered += offset - bases[n]
        if passed:
            self.position = max(self.position, int(rows["base_offset"][-1]) + int(rows["record_count"][-1]))
            self._window_size -= run.nbytes(passed)
            run.i += passed
            if not len(run):
                self._window.popleft()
        if then == "alone" and len(run):
            self._alone(run)
        return None if then == "wait" else delivered

    def _alone(self, run: Run) -> None:
        """Hand ``run``'s first entry to the entry-by-entry path: a window slot of its own, before the run."""
        entry = span_entry(run.span, run.i)
        self._window_size -= run.nbytes(1)
        run.i += 1
        if not len(run):
            self._window.popleft()
        disposition = self.state.classify(entry.header)
        keep = entry if disposition in (Disposition.DATA, Disposition.TXN_DATA) else None
        self._window.appendleft(_Slot(entry.slot, entry.header, keep, disposition))
        self._window_size += entry.nbytes if keep is not None else 0


def _batches_with_offsets(table: pa.Table | pa.RecordBatch) -> list[tuple[pa.RecordBatch, int]]:
    if isinstance(table, pa.RecordBatch):
        return [(table, 0)] if table.num_rows else []
    out = []
    offset = 0
    for batch in table.to_batches():
        if batch.num_rows:
            out.append((batch, offset))
            offset += batch.num_rows
    return out
