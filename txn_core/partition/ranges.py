"""Reading an offset range of one partition without the coordinator (PROTOCOL.md "Reading").

Engines that split a read over workers (Spark) plan on one long-lived process that has coordinator access
and read on others that have none. The planner (:func:`plan_range`) turns ``[start, end)`` of a partition
into an :class:`OffsetRange`: a small, picklable value holding everything a worker needs to deliver exactly
the records a :class:`~txn_core.partition.reader.PartitionReader` would deliver for those offsets. The worker
(:func:`read_range`) then reads entries by slot and applies the filters, never asking anyone anything.

Invariants :func:`plan_range` guarantees for a read_committed range (checked, never asserted):

* ``end <= read bound`` (last stable offset) at planning time. Every transaction with data below ``end`` is
  therefore decided, either by a marker in this partition or by the coordinator; the bound never moves
  back, so a range planned again later (a replayed micro-batch) gets the same records.
* ``aborted`` holds the key of every aborted transaction with data in the range (marker in the partition,
  or aborted by the coordinator, e.g. a timed-out dead producer, before its marker landed), and ``skips``
  every entry never to deliver (duplicates, zombie writes after a transaction's marker).

Entries are read ahead (:class:`~txn_core.partition.readahead.ReadAhead`) from stores whose reads wait on a round
trip; from local disk, whose reads are copies out of the page cache, a range is read on the caller's thread:
an engine runs a task per core, so a read-ahead thread would only add hand-offs (Spark: a local read of
10M rows ran ~10% faster inline).

Delivery rules of :func:`read_range` (the same as ``PartitionReader``): control entries never; entries
whose base offset a skip range covers never; data of an ``aborted`` transaction never under
read_committed; everything else is sliced to ``[start, end)`` and yielded as Arrow record batches with
the ``_topic``, ``_partition``, ``_offset``, ``_timestamp`` metadata columns when asked for. A
read_uncommitted range is bounded by the log end instead and keeps aborted data (skips still apply).

Entries removed by retention while a range waits or is read are data loss: :class:`DataLossError`, or,
when the caller accepts loss, the read continues at the new log start.

Damage (PROTOCOL.md "Damage"): planning works up to a damaged entry that is not marked lost (the available
end stops there, and :attr:`PartitionState.damage` says why); a range reaching into one raises its
:class:`DamagedEntryError`, or, when the caller accepts loss, skips the offsets its neighbours give it with a
warning. Offsets marked lost are always skipped, with a warning; a damaged payload or staged object is
treated the same way.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

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
from txn_core.format.segment import SegmentSpan
from txn_core.logs import get_logger
from txn_core.partition.aborted import SkipRanges, txn_key
from txn_core.partition.partition import Entry, PartitionLog, entry_of_lost
from txn_core.partition.readahead import ReadAhead
from txn_core.partition.reader import ISOLATION_LEVELS, READ_COMMITTED
from txn_core.partition.records import METADATA_FIELDS, MetadataColumns, StagedDataMissingError, entry_table
from txn_core.partition.runs import Run, decode, merged, range_run
from txn_core.partition.skipping import lost_records, skipped_lost, warn_skipped
from txn_core.partition.state import PartitionState
from txn_core.storage.parallel import inline_leaves

logger = get_logger(__name__)

#: Why a range read skips damage nobody marked lost (its caller accepts loss).
ACCEPTS_LOSS = "the reader accepts data loss (failOnDataLoss=false)"
#: Record batches yielded by :func:`read_range` hold at most this many rows (zero-copy slices).
MAX_BATCH_ROWS = 1 << 16


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """What a worker needs to read offsets ``[start, end)`` of one partition log (see module doc).

    ``start_slot`` is the slot of the entry containing ``start``. ``stop_slot``, when the planner knew it,
    is the first slot whose entry begins at or after ``end``: the reader never reads ahead into it (an
    entry read past the range would be fetched for nothing, and again by the task reading on from there).
    ``min_timestamp_ms``/``max_timestamp_ms`` (inclusive) prune whole entries by their append timestamp,
    which every record of an entry shares.
    """

    path: str
    topic: str
    partition: int
    start: int
    end: int
    start_slot: int
    isolation: str = READ_COMMITTED
    aborted: tuple[int, ...] = ()
    skips: tuple[tuple[int, int], ...] = ()
    min_timestamp_ms: int | None = None
    max_timestamp_ms: int | None = None
    stop_slot: int | None = None

    @property
    def size(self) -> int:
        return self.end - self.start


def available_end(state: PartitionState, isolation: str) -> int:
    """The end of what a reader may read now: the read bound (read_committed) or the log end.

    Scans new entry headers first. Under read_committed this may abort transactions past their timeout
    (see :meth:`PartitionState.read_bound`), so a dead producer holds the bound at most that long. A damaged
    entry not marked lost ends it too (``state.damage`` then names it; the caller decides whether a read
    that needed more fails).
    """
    _check_isolation(isolation)
    state.scan_to_end()
    return state.read_bound() if isolation == READ_COMMITTED else state.buffer.position


def plan_range(
    state: PartitionState,
    topic: str,
    partition: int,
    start: int,
    end: int,
    isolation: str,
    *,
    min_timestamp_ms: int | None = None,
    max_timestamp_ms: int | None = None,
) -> OffsetRange:
    """The :class:`OffsetRange` for ``[start, end)``, with its filters (see module doc for invariants).

    Raises :class:`DataLossError` if ``start`` is below the log start, :class:`OffsetOutOfRangeError` if
    ``end`` is beyond the log end, and :class:`TxnLogError` if a read_committed ``end`` is beyond the read
    bound (it would expose an open transaction).
    """
    _check_isolation(isolation)
    if not 0 <= start <= end:
        raise OffsetOutOfRangeError(f"{state.log.path}: invalid offset range [{start}, {end})")
    plog = state.log
    _check_not_removed(plog, start)
    if state.buffer.position < end:
        state.scan_to_end()
    _check_not_removed(plog, start)  # the scan may have met deletions the cached log start did not know
    if state.buffer.position < end and state.damage is not None:
        raise state.damage
    if state.buffer.position < end:
        raise OffsetOutOfRangeError(
            f"{plog.path}: offset {end} is beyond the log end {state.buffer.position}; the offsets do not "
            "belong to this log (was it deleted and re-created?)"
        )
    if isolation == READ_COMMITTED:
        bound = state.read_bound()  # also decides every open transaction below the bound
        if end > bound:
            raise TxnLogError(
                f"{plog.path}: range [{start}, {end}) extends past the last stable offset {bound}; reading "
                "it would expose an open transaction"
            )
        keys, skips = state.filters(start, end)
    else:  # aborted keys are not filters here; they excuse aborted staged data already cleaned up
        keys, skips = state.buffer.aborted.overlapping(start, end), state.buffer.skips.overlapping(start, end)
    slot = plog.slot_for_offset(start)
    return OffsetRange(
        plog.path,
        topic,
        partition,
        start,
        end,
        slot,
        isolation,
        tuple(sorted(set(keys))),
        tuple((int(a), int(b)) for a, b in skips),
        min_timestamp_ms,
        max_timestamp_ms,
        plog.known_stop_slot(end),
    )


def _check_not_removed(plog: PartitionLog, start: int) -> None:
    """Raise :class:`DataLossError` if ``start`` lies below the log start (re-read to confirm)."""
    first = plog.log_start_for(start)
    if start < first.offset:
        raise DataLossError(
            f"{plog.path}: offsets [{start}, {first.offset}) were removed by retention; the log now starts "
            f"at offset {first.offset}"
        )


def split_range(plog: PartitionLog, rng: OffsetRange, pieces: int, *, max_size: int | None = None) -> list[OffsetRange]:
    """``rng`` cut into up to ``pieces`` consecutive ranges of near-equal offset counts, none larger than
    ``max_size`` when ``pieces * max_size`` covers the range (an engine's cap on a task).

    A cut moves to the nearer edge of the entry it falls in when that edge lies within a quarter of a
    piece: an entry cut in two is fetched, verified and decoded by both tasks, and a piece of a few
    entries loses nothing by ending where an entry does (entries larger than that slack are still cut
    inside). The cuts depend on the entries alone, not on what this process remembers: an edge not
    known costs one header read (:meth:`PartitionLog.entry_span`). Each piece keeps the whole range's
    filters (a superset of its own, so delivery is unchanged) and gets the start slot of its first offset.
    """
    if pieces <= 1 or rng.size <= 1:
        return [rng]
    pieces = min(pieces, rng.size)
    slack = rng.size // (4 * pieces)
    cap = rng.size if max_size is None else max_size
    cuts, slots = [rng.start], [rng.start_slot]
    stops: list[int | None] = []
    for i in range(1, pieces):
        # A piece never passes the cap, and leaves the pieces after it room to stay under it.
        ideal = min(rng.start + rng.size * i // pieces, cuts[-1] + cap)

        def fits(edge: int, rest: int = pieces - i) -> bool:
            return cuts[-1] < edge < rng.end and edge - cuts[-1] <= cap and rng.end - edge <= rest * cap

        slot = plog.slot_for_offset(ideal)  # as every split did; the span below then costs no request
        try:
            _, base, after = plog.entry_span(ideal)
            edges = sorted([(ideal - base, base, slot), (after - ideal, after, slot + 1)])
        except (DamagedEntryError, ObjectNotFoundError):  # unreadable, or just removed: cut where planned,
            base, after, edges = -1, -1, []  # and the read reports the damage or the loss
        cut, at = next(
            ((edge, s) for away, edge, s in edges if away <= slack and fits(edge)),
            (ideal, slot),
        )
        if cut > cuts[-1]:
            cuts.append(cut)
            slots.append(at)
            stops.append(at if cut in (base, after) else at + 1)  # an entry cut inside is read by both
    cuts.append(rng.end)
    stops.append(rng.stop_slot)
    return [
        replace(rng, start=lo, end=hi, start_slot=slot, stop_slot=stop)
        for (lo, hi), slot, stop in zip(itertools.pairwise(cuts), slots, stops, strict=True)
    ]


def read_range(
    plog: PartitionLog,
    rng: OffsetRange,
    *,
    metadata: bool = True,
    fail_on_data_loss: bool = True,
    max_batch_rows: int = MAX_BATCH_ROWS,
    metadata_fields: Sequence[pa.Field] = METADATA_FIELDS,
) -> Iterator[pa.RecordBatch]:
    """Yield the deliverable records of ``rng`` in offset order (see module doc). Memory: one entry, or one
    span of a segment's entries (up to 4 MiB) taken as a run (:mod:`txn_core.partition.runs`).

    ``fail_on_data_loss=False`` accepts loss: offsets removed by retention, and damaged entries nobody
    marked lost, are skipped with a warning instead of raising. ``metadata_fields`` types the metadata
    columns (see :class:`~txn_core.partition.records.MetadataColumns`: an engine's own types, built without a cast)."""
    _check_isolation(rng.isolation)
    committed = rng.isolation == READ_COMMITTED
    aborted = frozenset(rng.aborted)
    skips = SkipRanges.from_list([list(s) for s in rng.skips])
    lo_ts, hi_ts = rng.min_timestamp_ms, rng.max_timestamp_ms
    pos, end, slot = rng.start, rng.end, rng.start_slot
    expected: int | None = None  # base offset the next entry must have
    meta = MetadataColumns(rng.topic, rng.partition, metadata_fields) if metadata else None
    ahead = ReadAhead(plog, slot, stop=rng.stop_slot)
    inline = not plog.storage.overlap_reads  # the task has its core: a hand-off would cost, not overlap
    drop = np.array(sorted(aborted), dtype=np.uint64) if committed else None
    while pos < end:
        ahead.seek(slot)
        try:
            with inline_leaves(inline):
                got = ahead.peek_span()
                taken = None
                if got is not None:
                    taken = _run(got[0], got[1], rng, pos, expected, drop, skips, meta, max_batch_rows)
                if taken is not None:
                    ahead.skip_span(taken[0])
                else:
                    entry = ahead.next()
        except ObjectNotFoundError:
            hole = _after_missing_entry(plog, slot, pos, end, fail_on_data_loss)
            if isinstance(hole, tuple):
                slot, pos = hole
                expected = None
                continue
            marked = plog.lost_entry(slot)
            entry = _damaged(plog, slot, hole, fail_on_data_loss) if marked is None else entry_of_lost(marked)
        except DamagedEntryError as exc:
            entry = _damaged(plog, slot, exc, fail_on_data_loss)
        else:
            if taken is not None:  # a run of a segment's entries (txn_core.partition.runs)
                passed, batches, pos = taken
                slot += passed
                expected = pos
                yield from batches
                continue
        header = entry.header
        if (
            expected is not None and header.base_offset != expected
        ) or not header.base_offset <= pos < header.next_offset:
            raise CorruptDataError(
                f"{entry.key}: holds offsets [{header.base_offset}, {header.next_offset}), expected the "
                f"entry containing offset {pos}",
                entry.key,
            )
        slot += 1
        expected = header.next_offset
        take_end = min(end, header.next_offset)
        if entry.lost is not None:
            warn_skipped(entry.lost, ACCEPTS_LOSS)
            pos = take_end
            continue
        deliver = (
            not header.is_control
            and not skips.covers(header.base_offset)
            and not (committed and header.txn is not None and txn_key(header.txn) in aborted)
            and not (lo_ts is not None and header.timestamp_ms < lo_ts)
            and not (hi_ts is not None and header.timestamp_ms > hi_ts)
        )
        if deliver:
            try:
                yield from _slices(plog, entry, (pos, take_end), meta, max_batch_rows)
            except CorruptDataError as exc:  # raised before the entry's first batch is yielded
                # read_uncommitted: an aborted transaction's staged rows may have been cleaned up
                cleaned = (
                    isinstance(exc, StagedDataMissingError)
                    and header.txn is not None
                    and txn_key(header.txn) in aborted
                )
                if not cleaned:
                    lost = lost_records(plog, entry.slot, header, exc, skip=not fail_on_data_loss)
                    if lost is None:
                        raise
                    warn_skipped(lost, ACCEPTS_LOSS)
        pos = take_end


def _run(
    span: SegmentSpan,
    i: int,
    rng: OffsetRange,
    pos: int,
    expected: int | None,
    drop: np.ndarray | None,
    skips: SkipRanges,
    meta: MetadataColumns | None,
    max_rows: int,
) -> tuple[int, list[pa.RecordBatch], int] | None:
    """The next entries of ``span`` (from its ``i``-th) taken as one run (:func:`range_run`), decoded:
    (entries passed, their record batches, the offset after them); None: go entry by entry. An entry that
    fails its checks ends the run before it (the entry path then raises or skips it)."""
    planned = range_run(
        span, i, pos=pos, end=rng.end, expected=expected, aborted=drop, skips=skips,
        min_ts=rng.min_timestamp_ms, max_ts=rng.max_timestamp_ms,
    )  # fmt: skip
    if planned is None:
        return None
    n, picked = planned
    run = Run(span, i, i + n)
    decoded = decode(run, picked) if len(picked) else []
    if len(decoded) < len(picked):
        n, picked = int(picked[len(decoded)]), picked[: len(decoded)]
    if not n:
        return None
    rows = span.rows[i : i + n]
    together = merged(meta, rows, picked, decoded)
    if together is None:
        bases, times = rows["base_offset"].tolist(), rows["timestamp_ms"].tolist()
        together = []
        for k, got in zip(picked.tolist(), decoded, strict=True):
            first = bases[k]
            for batch in got:
                together.append(batch if meta is None else meta.add(batch, first, times[k]))
                first += batch.num_rows
    out = [b.slice(at, max_rows) for b in together for at in range(0, b.num_rows, max_rows)]
    return n, out, int(rows["base_offset"][-1]) + int(rows["record_count"][-1])


def _slices(
    plog: PartitionLog, entry: Entry, span: tuple[int, int], meta: MetadataColumns | None, max_rows: int
) -> Iterator[pa.RecordBatch]:
    header = entry.header
    pos, stop = span
    table = entry_table(plog.storage, entry).slice(pos - header.base_offset, stop - pos)
    first = pos
    for batch in table.to_batches(max_chunksize=max_rows):
        n = batch.num_rows
        if not n:
            continue
        yield batch if meta is None else meta.add(batch, first, header.timestamp_ms)
        first += n


def _damaged(plog: PartitionLog, slot: int, exc: DamagedEntryError, fail_on_data_loss: bool) -> Entry:
    """The entry a planned read passes in place of the damaged one ``exc`` names, accepting loss (what its
    neighbours give); raises ``exc`` when it may not pass."""
    lost = None if fail_on_data_loss else skipped_lost(plog, exc)
    if lost is None:
        raise exc
    return entry_of_lost(lost, exc.header)


def _after_missing_entry(
    plog: PartitionLog, slot: int, pos: int, end: int, fail_on_data_loss: bool
) -> tuple[int, int] | DamagedEntryError:
    """Where to continue after the entry at ``slot`` (containing ``pos``) was not found: past offsets removed
    by retention; or, for a hole (the plan's end lies past ``pos``, so entries follow it), the damage."""
    start = plog.log_start(refresh=True)
    if start.slot <= slot:
        if plog.is_hole(slot):
            return plog.damaged(slot, plog.missing_check(slot))
        raise CorruptDataError(
            f"{plog.path}: entry slot {slot} (offset {pos}) is missing although the log starts at slot "
            f"{start.slot}; the partition log is damaged",
            plog.entries.key(slot),
        )
    message = (
        f"{plog.path}: offsets [{pos}, {min(start.offset, end)}) were removed by retention before "
        f"they were read; the log now starts at offset {start.offset}"
    )
    if fail_on_data_loss:
        raise DataLossError(message)
    logger.warning("%s; continuing at the log start", message)
    return start.slot, max(pos, start.offset)


def _check_isolation(isolation: str) -> None:
    if isolation not in ISOLATION_LEVELS:
        raise TxnLogError(f"isolation level must be one of {ISOLATION_LEVELS}, got {isolation!r}")
