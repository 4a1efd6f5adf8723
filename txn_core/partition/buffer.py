"""The transaction buffer of one partition (PROTOCOL.md "Transaction buffer").

State derived from the partition log alone, as of ``position`` (the offset after the last applied entry):

* ``ongoing``: transactions with data and no marker yet, ordered by first offset (a SortedDict);
* ``aborted``: the aborted-transaction index (transaction -> first, last, marker offsets);
* ``skips``: offset ranges never to deliver (duplicates, zombie writes after a commit marker);
* ``producers``: per-producer epoch and sequence, for de-duplication;
* ``gaps``: entries that follow a sequence gap (delivering one raises OutOfOrderSequenceError);
* ``ended``: transactions whose marker was applied recently, with the outcome (a bounded cache);
* ``lost_outcomes``: transactions that were open when the buffer passed a lost entry (which may have held
  their marker), with the outcome its lost-entry record gives (PROTOCOL.md "Damage").

The log-derived max read position (last stable offset) is the first offset of the earliest ongoing
transaction, else ``position``. Readers lift it further with the coordinator's decisions (a transaction
that is prepared or complete is no longer open, even before its marker reaches this partition).

The state is a pure function of the log prefix, so snapshots taken by different participants at the same
position are interchangeable, and "snapshot + replay of the tail" equals "replay from the start"
(tested property).
"""

from __future__ import annotations

import dataclasses
import enum
from collections import OrderedDict
from dataclasses import dataclass

from sortedcontainers import SortedDict

from txn_core.format.entry import EntryHeader, EntryKind
from txn_core.format.ids import TxnId
from txn_core.partition.aborted import AbortedIndex, SkipRanges
from txn_core.partition.lost import ONGOING, UNKNOWN, LostEntry
from txn_core.partition.sequences import PRODUCER_EXPIRY_STEP_MS, ProducerStates, SequenceCheck

ENDED_CACHE = 100_000


class Disposition(enum.Enum):
    """What an applied entry is to a read_committed reader."""

    DATA = "data"  # non-transactional data: visible below the read bound
    TXN_DATA = "txn"  # transactional data: visible iff its transaction commits
    CONTROL = "control"  # a marker: never delivered
    SKIP = "skip"  # duplicate, fenced or zombie write: never delivered
    ABORTED = "aborted"  # data of an already-aborted transaction: never delivered
    LOST = "lost"  # offsets of an entry whose records are gone (PROTOCOL.md "Damage"): never delivered


@dataclass(slots=True)
class OngoingTxn:
    txn: TxnId
    first_offset: int
    last_offset: int
    producer_id: int
    producer_epoch: int
    entries: int
    #: timestamp of the transaction's first entry here (None from a snapshot older than the field): where
    #: the timeout of a transaction begun ahead runs from, for this partition's readers
    first_ms: int | None = None


class TxnBuffer:
    """Transaction state of one partition as of ``position``. Not thread-safe."""

    def __init__(self, position: int = 0, slot: int = 0) -> None:
        self.position = position
        self.slot = slot
        self.ongoing: SortedDict = SortedDict()  # first offset -> OngoingTxn
        self.by_txn: dict[TxnId, OngoingTxn] = {}
        self.aborted = AbortedIndex()
        self.skips = SkipRanges()
        self.producers = ProducerStates()
        self.ended: OrderedDict[TxnId, tuple[bool, int]] = OrderedDict()  # txn -> (committed, marker)
        #: entries after a sequence gap: offset -> (producer id, epoch, expected, got); fail if delivered
        self.gaps: dict[int, tuple[int, int, int, int]] = {}
        #: open transactions a lost entry may have ended -> outcome from its record (None: none recorded,
        #: the entry was skipped unmarked; the transaction log decides). Bounded by the open transactions.
        self.lost_outcomes: dict[TxnId, str | None] = {}
        #: a damaged entry not marked lost was skipped (a reader's own choice): never to be snapshotted
        self.skipped_unmarked = False
        self.size_bytes = 0
        self.committed_count = 0
        self.aborted_count = 0
        self.ended_since_snapshot = 0
        #: entries applied since the last snapshot (a partition without transactions needs snapshots too)
        self.entries_since_snapshot = 0
        #: log time: the newest entry timestamp applied; idle producer states expire by it (see _advance)
        self.log_time_ms = 0
        self.where = ""

    # --- apply ----------------------------------------------------------------------------------

    def apply(self, slot: int, header: EntryHeader, size: int, lost: LostEntry | None = None) -> Disposition:
        """Apply the entry at ``slot`` (which must be the next one) and classify it. An entry of kind LOST
        comes with its ``lost`` record."""
        if header.base_offset != self.position:
            raise ValueError(
                f"{self.where}: entry at slot {slot} starts at offset {header.base_offset}, buffer is at "
                f"{self.position}"
            )
        if header.kind is EntryKind.LOST:
            if lost is None:
                raise ValueError(f"{self.where}: the lost entry at slot {slot} came without its record")
            return self._apply_lost(slot, header, size, lost)
        txn = header.txn
        if header.carried is not None:
            # A carried marker (PROTOCOL.md "Carried markers") applies first, at the entry's base offset,
            # whatever becomes of the entry's own records (a fenced or duplicate carrier's marker counts).
            marker = header.carried
            self._end(marker.txn, marker.committed, header.base_offset)
        if header.kind.is_control:
            self._advance(slot, header, size)
            if txn is not None:
                self._end(txn, header.kind == EntryKind.COMMIT, header.base_offset)
            return Disposition.CONTROL
        if txn is not None and txn in self.aborted:
            self._advance(slot, header, size)
            # A zombie write into an aborted transaction, after its marker: the aborted index's offset
            # range ends before the marker, so only a skip range tells range readers to drop it.
            self.skips.add(header.base_offset, header.last_offset)
            return Disposition.ABORTED
        if txn is not None and txn in self.ended:
            self._advance(slot, header, size)
            self.skips.add(header.base_offset, header.last_offset)
            return Disposition.SKIP  # a write after its transaction's commit marker
        check = self.producers.check(
            header.producer_id,
            header.producer_epoch,
            header.base_sequence,
            header.record_count,
            header.timestamp_ms,
            self.where,
            header.base_offset,
        )
        self._advance(slot, header, size)
        if check is SequenceCheck.GAP:
            expected, got = self.producers.last_gap
            self.gaps[header.base_offset] = (header.producer_id, header.producer_epoch, expected, got)
        if txn is None:
            if check in (SequenceCheck.DUPLICATE, SequenceCheck.FENCED):
                self.skips.add(header.base_offset, header.last_offset)
                return Disposition.SKIP
            return Disposition.DATA
        if check in (SequenceCheck.DUPLICATE, SequenceCheck.FENCED):
            # A write after its transaction's marker (a zombie), a duplicate, or a fenced epoch.
            self.skips.add(header.base_offset, header.last_offset)
            return Disposition.SKIP
        cur = self.by_txn.get(txn)
        if cur is None:
            cur = OngoingTxn(
                txn,
                header.base_offset,
                header.last_offset,
                header.producer_id,
                header.producer_epoch,
                1,
                header.timestamp_ms,
            )
            self.by_txn[txn] = cur
            self.ongoing[header.base_offset] = cur
        else:
            cur.last_offset = header.last_offset
            cur.entries += 1
        return Disposition.TXN_DATA

    def _apply_lost(self, slot: int, header: EntryHeader, size: int, lost: LostEntry) -> Disposition:
        # Its records are gone. It may have held the marker of any transaction open here: remember what
        # the record says of each (the marker that follows, if any, still decides). It may have held any
        # producer's next sequence numbers: each one's next entry resynchronises it.
        for txn in self.by_txn:
            if self.lost_outcomes.get(txn) in (None, ONGOING):
                self.lost_outcomes[txn] = lost.outcome(txn) if lost.marked else None
        self.producers.resync_all()
        self.skipped_unmarked |= not lost.marked
        self._advance(slot, header, size)
        return Disposition.LOST

    def _advance(self, slot: int, header: EntryHeader, size: int) -> None:
        self.position = header.next_offset
        self.slot = slot + 1
        self.size_bytes += size
        self.entries_since_snapshot += 1
        if header.timestamp_ms > self.log_time_ms:
            step = PRODUCER_EXPIRY_STEP_MS
            crossed = header.timestamp_ms // step != self.log_time_ms // step
            self.log_time_ms = header.timestamp_ms
            if crossed:
                # Idle producer states are dropped by log time, at fixed points of it, so the buffer stays
                # a function of the log prefix: every participant drops the same ones at the same entry.
                self.producers.expire(self.log_time_ms)

    def _end(self, txn: TxnId, committed: bool, marker: int) -> None:
        if txn in self.ended or txn in self.aborted:
            return  # a repeated marker (a retried or concurrent completion) changes nothing
        cur = self.by_txn.pop(txn, None)
        if cur is not None:
            del self.ongoing[cur.first_offset]
        self.lost_outcomes.pop(txn, None)
        if not committed:
            if cur is not None:
                self.aborted.add(txn, cur.first_offset, cur.last_offset, marker)
            else:
                self.aborted.add(txn, -1, -1, marker)
            self.aborted_count += 1
        else:
            self.committed_count += 1
        self.ended[txn] = (committed, marker)
        while len(self.ended) > ENDED_CACHE:
            self.ended.popitem(last=False)
        self.ended_since_snapshot += 1

    def drop_incarnation(self, txn: TxnId, entries: list[tuple[int, int]]) -> None:
        """Turn the ongoing data of ``txn`` into skip ranges: it was written after ``txn`` ended (its
        marker lies before it, outside what this buffer remembers). Deterministic for every reader that
        reaches the same conclusion from the transaction log."""
        cur = self.by_txn.pop(txn, None)
        if cur is None:
            return
        del self.ongoing[cur.first_offset]
        self.lost_outcomes.pop(txn, None)
        for first, last in entries:
            self.skips.add(first, last)
        self.ended[txn] = (True, -1)

    def skip_slot(self, slot: int, header: EntryHeader) -> None:
        """Advance past an entry without classifying it (used below a snapshot's position)."""
        self.position = header.next_offset
        self.slot = slot + 1

    # --- queries --------------------------------------------------------------------------------

    @property
    def max_read_position(self) -> int:
        """Log-derived last stable offset: first offset of the earliest ongoing transaction, else position."""
        if self.ongoing:
            return int(self.ongoing.keys()[0])
        return self.position

    def decided_read_position(self, *, blocked: bool) -> int:
        """:attr:`max_read_position`, passing transactions that a lost entry's record decided (commit, abort
        or unknown: PROTOCOL.md "Damage"). Such a transaction stays open here, since its marker may have
        been that entry or may still follow, but every reader decides it the same way from this log
        prefix alone (the marker if one follows, else the record), never from the transaction log.
        ``blocked``: the buffer stopped at damage nobody marked lost, behind which a marker may lie; readers
        wait for that marker rather than take an unknown outcome, so an unknown one decides nothing."""
        undecided = (None, ONGOING, UNKNOWN) if blocked else (None, ONGOING)
        for first, txn in self.ongoing.items():
            if self.lost_outcomes.get(txn.txn) in undecided:
                return int(first)
        return self.position

    def is_aborted(self, txn: TxnId) -> bool:
        return txn in self.aborted

    def outcome(self, txn: TxnId) -> bool | None:
        """True committed / False aborted by a marker in this partition; None when not known here."""
        if txn in self.aborted:
            return False
        ended = self.ended.get(txn)
        if ended is not None:
            return ended[0]
        return None

    def prune(self, log_start: int) -> None:
        """Forget what retention removed: aborted transactions and skips below ``log_start``."""
        self.aborted.prune(log_start)
        self.skips.prune(log_start)
        for off in [o for o in self.gaps if o < log_start]:
            del self.gaps[off]

    def filters(self, start: int, end: int) -> tuple[list[int], list[tuple[int, int]]]:
        """What a reader of ``[start, end)`` must drop: aborted transaction keys and skip ranges."""
        return self.aborted.overlapping(start, end), self.skips.overlapping(start, end)

    def copy(self) -> TxnBuffer:
        """An independent copy (used to snapshot while scanning continues)."""
        b = TxnBuffer(self.position, self.slot)
        b.ongoing = SortedDict({k: dataclasses.replace(v) for k, v in self.ongoing.items()})
        b.by_txn = {v.txn: v for v in b.ongoing.values()}
        b.aborted = AbortedIndex.from_tables([self.aborted.to_table()])
        b.skips = SkipRanges.from_list(self.skips.to_list())
        b.producers = self.producers.copy()
        b.ended = OrderedDict(self.ended)
        b.gaps = dict(self.gaps)
        b.lost_outcomes = dict(self.lost_outcomes)
        b.skipped_unmarked = self.skipped_unmarked
        b.size_bytes, b.committed_count, b.aborted_count = self.size_bytes, self.committed_count, self.aborted_count
        b.log_time_ms = self.log_time_ms
        b.where = self.where
        return b

    def _check(self) -> None:
        """Invariants (called by stress tests after every step)."""
        if len(self.ongoing) != len(self.by_txn):
            raise AssertionError("ongoing and by_txn disagree")
        for first, o in self.ongoing.items():
            indexed = self.by_txn.get(o.txn)
            if first != o.first_offset or indexed is None or indexed.first_offset != first:
                raise AssertionError(f"ongoing entry {first} is inconsistent")
            if not o.first_offset <= o.last_offset < self.position:
                raise AssertionError(f"ongoing {o.txn} range {o.first_offset}..{o.last_offset} beyond {self.position}")
            if o.txn in self.aborted or o.txn in self.ended:
                raise AssertionError(f"{o.txn} is both ongoing and ended")
        if self.max_read_position > self.position:
            raise AssertionError("max read position beyond position")
        if any(t not in self.by_txn for t in self.lost_outcomes):
            raise AssertionError("a lost-entry outcome is kept for a transaction that is not open")
        self.aborted._check()
        self.skips._check()
