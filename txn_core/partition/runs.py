"""Reading runs of a segment's entries by columns (PROTOCOL.md "Reading", "Segments").

A rolled partition holds thousands of small entries per segment (one-row transactions and their markers).
Made one object at a time (header, entry, window slot, record batch), they cost a reader tens of
microseconds each: a history of 7,200 entries would take longer to walk than to fetch. A :class:`Run` is
consecutive entries of one :class:`~txn_core.format.segment.SegmentSpan` that a read_committed
:class:`~txn_core.partition.reader.PartitionReader` takes whole: classified from the index's columns
with the buffer's aborted index and skip ranges (vectorized), decoded in one Arrow read
(:mod:`txn_core.format.ipcrun`), and handed out as a few batches with metadata columns built at once.

The rules are the reader's own, entry by entry (:meth:`PartitionReader.poll`); a run only takes what they
decide without asking anything more:

* **Taken** (:func:`run_length`): entries of kinds DATA, COMMIT and ABORT, continuing the offsets the
  reader expects, within the window's bytes, from a segment whose index rows all pass their checks. Those
  the buffer has not applied yet are applied as the entry-by-entry path applies them (their headers built
  from the index at once); afterwards the buffer's skip ranges, aborted index and ongoing transactions say
  of each entry what the disposition the entry-by-entry path keeps would say (every entry ``apply``
  classes SKIP or ABORTED gets a skip range). Anything else (a DATA_REF, a SEAL, damage) is left to the
  entry-by-entry path, which handles every case.
* **Delivered** (:func:`plan_delivery`): entries not control, not covered by a skip range, and either
  not transactional or of a transaction neither aborted (aborted index) nor decided aborted by the
  coordinator (``decisions``). A run stops, as the reader does, at the read bound and at a transaction
  not decided yet; and hands the rest of its entries back to the entry-by-entry path at anything it does
  not decide itself: an entry partly delivered, a sequence gap, the budget ending inside an entry, a
  payload that fails its checksum or does not decode. That path then delivers, slices or raises exactly
  as it always does.
* **Range reads** (:func:`range_run`, for :func:`~txn_core.partition.ranges.read_range`): whole entries
  from the range's position that end by its end, delivered by the plan's own filters (skip ranges,
  timestamp bounds, and under read_committed its aborted keys); an entry straddling either edge goes entry
  by entry.

Crash windows: none (it only reads).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from txn_core.errors import CorruptDataError
from txn_core.format.entry import EntryKind, decode_arrow
from txn_core.format.ids import TxnId
from txn_core.format.ipcrun import MAX_RUN_BYTES, decode_run, spliceable
from txn_core.format.segment import SegmentSpan
from txn_core.partition.aborted import SkipRanges, key_txn, txn_key, txn_keys
from txn_core.partition.buffer import TxnBuffer
from txn_core.partition.records import MAX_MERGED_BYTES, MetadataColumns

#: Kinds a run takes; anything else goes entry by entry.
RUN_KINDS = np.array([int(EntryKind.DATA), int(EntryKind.COMMIT), int(EntryKind.ABORT)], dtype=np.uint8)
#: A run is worth its columns from this many entries on.
MIN_RUN = 2


@dataclass(slots=True)
class Run:
    """Entries ``[i, j)`` of ``span`` in a reader's window."""

    span: SegmentSpan
    i: int
    j: int

    @property
    def slot(self) -> int:
        return self.span.first + self.i

    def __len__(self) -> int:
        return self.j - self.i

    def nbytes(self, n: int | None = None) -> int:
        """Bytes of its first ``n`` entries (all by default), as the window counts them."""
        rows = self.span.rows[self.i : self.j if n is None else self.i + n]
        return int(rows["length"].sum() + rows["data_len"].sum())


def run_length(span: SegmentSpan, i: int, expected: int | None, position: int, room: int) -> int:
    """How many entries of ``span`` from ``i`` on a reader may take as one run (0: none, go entry by entry):
    of :data:`RUN_KINDS`, continuing the offsets the reader expects, within ``room`` bytes (at least one).

    ``expected`` is the base offset the next entry must have (None: it must hold ``position``, the first
    after a seek). The reader applies those the buffer has not (:meth:`PartitionReader._take_run`)."""
    rows = span.rows[i:]
    if len(rows) < MIN_RUN or span.index.damaged:
        return 0
    bases = rows["base_offset"]
    first, first_next = int(bases[0]), int(bases[0]) + int(rows["record_count"][0])
    if expected is not None and first != expected:
        return 0
    if expected is None and not (first <= position < first_next or first == position):
        return 0
    n = len(rows)
    other = np.flatnonzero(~np.isin(rows["kind"], RUN_KINDS))
    if len(other):
        n = int(other[0])
    sizes = np.cumsum(rows["length"][:n].astype(np.int64) + rows["data_len"][:n].astype(np.int64))
    n = max(min(n, int(np.searchsorted(sizes, room, side="right"))), min(n, 1))
    return n if n >= MIN_RUN else 0


@dataclass(slots=True)
class Delivery:
    """What a run delivers now (:func:`plan_delivery`): its first ``passed`` entries, of which those in
    ``deliver`` (indexes from the run's start) hold records; then ``then``: ``"more"`` (the run goes on
    with nothing in the way), ``"wait"`` (the read bound or an undecided transaction: stop polling) or
    ``"alone"`` (hand the next entry to the entry-by-entry path)."""

    passed: int
    deliver: np.ndarray
    then: str


def plan_delivery(
    run: Run,
    buffer: TxnBuffer,
    decisions: Callable[[TxnId], bool | None],
    position: int,
    bound: int,
    budget: int,
) -> Delivery:
    """Which of ``run``'s entries a read_committed reader at ``position`` delivers now (see module doc)."""
    rows = run.span.rows[run.i : run.j]
    bases = rows["base_offset"].astype(np.int64)
    counts = rows["record_count"].astype(np.int64)
    nexts = bases + counts
    gone = int(np.searchsorted(nexts, position, side="right"))  # wholly before the position: passed over
    if gone:
        return Delivery(gone, np.empty(0, dtype=np.int64), "more")
    if bases[0] < position:
        return Delivery(0, np.empty(0, dtype=np.int64), "alone")  # partly delivered: sliced entry by entry
    end, then = len(rows), "more"
    below = int(np.searchsorted(bases, bound, side="left"))
    if below < end:
        end, then = below, "wait"
    data = rows["kind"] == int(EntryKind.DATA)
    deliver = data & ~buffer.skips.covers_many(bases)
    txn = (rows["flags"] & 1).astype(bool) & deliver
    if txn.any():
        at = np.flatnonzero(txn)
        keys, valid = txn_keys(rows["txn_hi"][at], rows["txn_lo"][at])
        if not valid.all():
            bad = int(at[np.flatnonzero(~valid)[0]])
            if bad < end:
                end, then = bad, "alone"  # the entry path raises, naming the id
        aborted = buffer.aborted.contains_keys(keys)
        deliver[at[aborted]] = False
        if buffer.by_txn:
            ongoing = {txn_key(t) for t in buffer.by_txn}
            for n, key in zip(at[~aborted].tolist(), keys[~aborted].tolist(), strict=True):
                if key in ongoing:
                    decided = decisions(key_txn(key))
                    if decided is None:
                        if n < end:
                            end, then = n, "wait"
                        break
                    deliver[n] = decided
    if buffer.gaps:
        for offset in buffer.gaps:
            n = int(np.searchsorted(bases, offset, side="left"))
            if n < end and bases[n] == offset and deliver[n]:
                end, then = n, "alone"  # the entry path raises the gap
    rows_before = np.cumsum(np.where(deliver[:end], counts[:end], 0))
    over = int(np.searchsorted(rows_before, budget, side="right"))
    if over < end:
        end, then = over, "alone"  # the budget ends inside this entry: sliced entry by entry
    picked = np.flatnonzero(deliver[:end])
    return Delivery(end, picked, then)


def decode(run: Run, picked: np.ndarray) -> list[list[pa.RecordBatch]]:
    """The record batches of each picked entry (indexes from the run's start), in order: spliced into one
    Arrow read up to :data:`MAX_RUN_BYTES` where they can be, else one by one. Stops before an entry that
    fails its checksum or its decoding (fewer lists than entries picked): the entry-by-entry path then
    meets it and raises what it always raises."""
    span = run.span
    counts = span.rows["record_count"]
    out: list[list[pa.RecordBatch]] = []
    pending: list[tuple[int, memoryview]] = []
    size = 0

    def alone(n: int, payload: memoryview) -> list[pa.RecordBatch] | None:
        try:
            table = decode_arrow(payload, span.index.where(span.first + run.i + n))
        except CorruptDataError:
            return None
        if table.num_rows != int(counts[run.i + n]):
            return None
        return [b for b in table.to_batches() if b.num_rows]

    def flush() -> bool:
        nonlocal size
        ns = [n for n, _ in pending]
        batches = decode_run([p for _, p in pending], [int(counts[run.i + n]) for n in ns])
        if batches is not None:
            out.extend([b] for b in batches)
        else:
            for n, payload in pending:
                got = alone(n, payload)
                if got is None:
                    return False
                out.append(got)
        pending.clear()
        size = 0
        return True

    wanted = picked.tolist()
    payloads = span.payloads([run.i + n for n in wanted])
    for n, payload in zip(wanted, payloads, strict=False):
        if (not spliceable(payload) or size + len(payload) > MAX_RUN_BYTES) and not flush():
            return out
        if not spliceable(payload):
            got = alone(n, payload)
            if got is None:
                return out
            out.append(got)
            continue
        pending.append((n, payload))
        size += len(payload)
    flush()
    return out


def merged(
    meta: MetadataColumns | None, rows: np.ndarray, picked: np.ndarray, batches: list[list[pa.RecordBatch]]
) -> list[pa.RecordBatch] | None:
    """The decoded entries ``picked`` (indexes into ``rows``, their index rows; ``batches`` as
    :func:`decode` gave them) merged into batches of at most about :data:`MAX_MERGED_BYTES` of payload each
    (merging copies), with metadata columns when ``meta`` is given (built at once: each entry's rows at
    offsets from its base offset, stamped with its append time). None when an entry holds other than one
    batch: the caller hands them out one by one."""
    if not batches or not all(len(got) == 1 for got in batches):
        return None
    at = picked[: len(batches)]
    counts = rows["record_count"][at].astype(np.int64)
    firsts, times = rows["base_offset"][at].astype(np.int64), rows["timestamp_ms"][at].astype(np.int64)
    sizes = np.cumsum(rows["payload_len"][at].astype(np.int64))
    cuts = np.searchsorted(sizes, np.arange(MAX_MERGED_BYTES, int(sizes[-1]), MAX_MERGED_BYTES)).tolist()
    out = []
    for a, b in itertools.pairwise([*dict.fromkeys([0, *cuts]), len(at)]):
        group = [got[0] for got in batches[a:b]]
        if meta is not None:
            out.append(meta.add_run(group, firsts[a:b], counts[a:b], times[a:b]))
        elif len(group) == 1:
            out.append(group[0])
        else:
            out.extend(pa.Table.from_batches(group).combine_chunks().to_batches())
    return out


def range_run(
    span: SegmentSpan,
    i: int,
    *,
    pos: int,
    end: int,
    expected: int | None,
    aborted: np.ndarray | None,
    skips: SkipRanges,
    min_ts: int | None,
    max_ts: int | None,
) -> tuple[int, np.ndarray] | None:
    """For a planned range read (:func:`~txn_core.partition.ranges.read_range`) at ``pos`` of ``[.., end)``:
    how many entries of ``span`` from ``i`` it takes as one run, and which of them (indexes from ``i``) it
    delivers; None: go entry by entry. Only whole entries from ``pos`` on that end by ``end``; the rules
    are the range read's own: not control, not covered by ``skips``, stamped within the bounds, and (when
    ``aborted``, the sorted keys a read_committed range drops, is given) not of an aborted transaction."""
    n = run_length(span, i, expected, pos, 1 << 62)
    if not n:
        return None
    rows = span.rows[i : i + n]
    bases = rows["base_offset"].astype(np.int64)
    if int(bases[0]) != pos:
        return None  # it begins before the position: sliced entry by entry
    n = min(n, int(np.searchsorted(bases + rows["record_count"], end, side="right")))
    rows, bases = rows[:n], bases[:n]
    deliver = (rows["kind"] == int(EntryKind.DATA)) & ~skips.covers_many(bases)
    if min_ts is not None:
        deliver &= rows["timestamp_ms"] >= min_ts
    if max_ts is not None:
        deliver &= rows["timestamp_ms"] <= max_ts
    txn = (rows["flags"] & 1).astype(bool) & deliver
    if aborted is not None and txn.any():
        at = np.flatnonzero(txn)
        keys, valid = txn_keys(rows["txn_hi"][at], rows["txn_lo"][at])
        if not valid.all():
            n = int(at[np.flatnonzero(~valid)[0]])  # the entry path raises, naming the id
        deliver[at[np.isin(keys, aborted)]] = False
    if n < MIN_RUN:
        return None
    return n, np.flatnonzero(deliver[:n])
