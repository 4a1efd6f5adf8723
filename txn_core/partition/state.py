"""A partition's transaction state for readers (PROTOCOL.md "Reading" and "Read bound").

:class:`PartitionState` keeps a partition's :class:`TxnBuffer` current (snapshot + header scan of the
tail) and lifts its log-derived max read position with the coordinator's decisions: the **read bound**
(last stable offset) is the first offset of the earliest transaction that is ongoing in this partition
*and* undecided in the transaction log. A transaction past its timeout is aborted on the spot by the
coordinator's resolver (:class:`Resolver`, given by the layer above), so a dead producer never holds the
bound longer than its timeout.

Damage (PROTOCOL.md "Damage"): a header scan stops at a damaged entry that is not marked lost and records
it in :attr:`PartitionState.damage` (the read bound, planning and describe work up to it). Offsets marked
lost are passed over with a warning. A state made with ``skip_damaged=True`` also passes damage nobody
marked, with a warning, and then writes no snapshots. Delivering records is :mod:`txn_core.partition.reader`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Protocol

from txn_core.errors import (
    DamagedEntryError,
    ObjectNotFoundError,
)
from txn_core.format.entry import HEADER_SIZE, EntryHeader, EntryKind
from txn_core.format.ids import TxnId
from txn_core.format.states import CoordinatorState, TxnStatus
from txn_core.logs import get_logger
from txn_core.partition import partition as partition_module
from txn_core.partition.buffer import Disposition, TxnBuffer
from txn_core.partition.lost import ABORT, COMMIT, ONGOING, UNKNOWN, LostEntry
from txn_core.partition.partition import PartitionLog
from txn_core.partition.readahead import HeaderReadAhead
from txn_core.partition.sequences import gap_error
from txn_core.partition.skipping import skipped_lost, warn_skipped
from txn_core.partition.snapshots import SnapshotStore
from txn_core.storage.guarded import opportunistic


class Resolver(Protocol):
    """:meth:`TransactionCoordinator.resolve`: a transaction's status, its timeout enforced; ``first_write``
    tells when the caller's log saw its first entry (the start of a transaction begun ahead)."""

    def __call__(self, txn: TxnId, first_write: Callable[[], int | None] | None = None) -> TxnStatus: ...


logger = get_logger("txnlog.reader")  # the readers' logger, as before the state had a module of its own
#: Entry headers a reader reads ahead for a transaction's marker before asking the transaction log.
MARKER_LOOKAHEAD = 2


class PartitionState:
    """The transaction buffer of one partition plus coordinator decisions. Not thread-safe."""

    def __init__(
        self, log: PartitionLog, resolver: Resolver, *, write_snapshots: bool = True, skip_damaged: bool = False
    ) -> None:
        self.log = log
        self.resolver = resolver
        self.snapshots = SnapshotStore(log.storage, log.path, clock=log.clock)
        self.write_snapshots = write_snapshots
        #: pass damaged entries nobody marked lost (with a warning) instead of stopping at them
        self.skip_damaged = skip_damaged
        #: the damaged entry, not marked lost, that the last scan stopped at (None: it reached the end)
        self.damage: DamagedEntryError | None = None
        self._not_hole: tuple[int, float] | None = None  # (slot, when) a full scan found the log end there
        self._buffer: TxnBuffer | None = None
        self._listed = False  # open_listings() ran (a first load lists everything it needs in one round)
        self.decisions: dict[TxnId, bool] = {}
        self.snapshot_position = 0
        #: header scans of the tail read ahead (a cold open with no snapshot reads every header)
        self.headers = HeaderReadAhead(log)

    def open_listings(self) -> None:
        """List what opening this state and reading from it needs, in one round: the log start, the
        segments, the loose entries (a hint) and the snapshots (:meth:`PartitionLog.open_listings`)."""
        self._listed = True
        if self._buffer is None:
            self.log.open_listings(self.snapshots.list_ahead)
        else:
            self.log.open_listings()

    @property
    def buffer(self) -> TxnBuffer:
        if self._buffer is None:
            self._buffer = self._load()
        return self._buffer

    def _load(self, at_most: int | None = None) -> TxnBuffer:
        if not self._listed:
            self.open_listings()  # a first load: its listings in one round
        start = self.log.log_start()
        buffer = self.snapshots.load_latest(self.log.path, at_most=at_most)
        if buffer is None or buffer.position < start.offset:
            buffer = TxnBuffer(start.offset, start.slot)
            buffer.size_bytes = start.bytes_before  # size counts every entry since offset 0
        else:
            buffer.prune(start.offset)  # what retention removed since the snapshot was taken
        buffer.where = self.log.path
        self.snapshot_position = buffer.position
        return buffer

    def reload(self, at_most: int | None = None) -> TxnBuffer:
        """Rebuild the buffer from the newest snapshot (after retention removed what it had not seen), or with
        ``at_most`` from the newest at or before that position (else from the log start), to scan the log as
        it stood there: marking a damaged entry lost needs the transactions open just before it, though a
        snapshot taken before the damage happened may lie past it."""
        self._buffer = self._load(at_most=at_most)
        self.decisions.clear()
        return self._buffer

    def apply(self, slot: int, header: EntryHeader, size: int, lost: LostEntry | None = None) -> Disposition:
        if header.kind is EntryKind.LOST and lost is None:
            lost = self.log.lost_entry(slot)
        disposition = self.buffer.apply(slot, header, size, lost)
        if header.is_control and header.txn is not None:
            self.decisions.pop(header.txn, None)
        if header.carried is not None:
            self.decisions.pop(header.carried.txn, None)
        if self.damage is not None and slot >= self.damage.slot:
            self.damage = None  # passed: marked lost or restored since
        return disposition

    def scan_to_end(self, *, max_entries: int | None = None) -> int:
        """Apply every entry after the buffer position, reading headers only. Returns entries applied.

        Stops at a damaged entry not marked lost (recorded in :attr:`damage`) unless ``skip_damaged``."""
        buffer = self.buffer
        self.damage = None
        n = 0
        while max_entries is None or n < max_entries:
            try:
                step = self.next_entry(self.headers.next)
            except ObjectNotFoundError:
                if self.log.deleted(buffer.slot):
                    # Retention removed entries this buffer had not applied: restart from its snapshot.
                    buffer = self.reload()
                    continue
                break
            if step is None:
                break
            header, lost = step
            if lost is not None and not lost.marked:
                warn_skipped(lost)
            self.apply(buffer.slot, header, HEADER_SIZE + header.payload_len, lost)
            n += 1
        self.maybe_snapshot(behind=True)  # its caller has the scan's answer while the snapshot is written
        return n

    def next_entry(self, read: Callable[[int], EntryHeader]) -> tuple[EntryHeader, LostEntry | None] | None:
        """The header (with ``read``) and lost record of the entry at the buffer's slot; None when a damaged
        entry stops this state there (:attr:`damage`). Raises ObjectNotFoundError at the log end."""
        slot = self.buffer.slot
        try:
            header = read(slot)
        except DamagedEntryError as exc:
            return self._past_damage(exc)
        return header, (self.log.lost_entry(slot) if header.kind is EntryKind.LOST else None)

    def _past_damage(self, exc: DamagedEntryError) -> tuple[EntryHeader, LostEntry | None] | None:
        """What :meth:`next_entry` gives for the damaged entry at the buffer's slot (see :meth:`skipped`)."""
        exc.first_offset = self.buffer.position
        lost = self.skipped(exc)
        return None if lost is None else (lost.header(), lost)

    def skipped(self, exc: DamagedEntryError) -> LostEntry | None:
        """The unmarked lost record to pass the damaged entry ``exc`` names with (``skip_damaged``, and
        its offsets known), or None: it stops this state, and :attr:`damage` says so. Whoever passes the
        offsets says so in a warning."""
        lost = skipped_lost(self.log, exc) if self.skip_damaged else None
        if lost is None:
            self.damage = exc
        return lost

    def maybe_snapshot(self, *, behind: bool = False) -> None:
        """Write a buffer snapshot if one is due (PROTOCOL.md "Snapshots"); skipped on a read-only store.
        ``behind``: on the shared pool from a copy of the buffer, so that a reader that has just delivered
        never waits for it (:meth:`SnapshotStore.write_behind`)."""
        if self._buffer is not None and self._buffer.skipped_unmarked:
            return  # this reader's choice to skip damage is its own: never handed on in a snapshot
        storage = self.log.storage
        if (
            self.write_snapshots
            and self._buffer is not None
            and not storage.read_only
            and self.snapshots.due(self._buffer)
        ):
            buffer, start = self._buffer, self.log.log_start().offset
            snapshots = self.snapshots
            if behind:
                snapshots.write_behind(
                    buffer,
                    start,
                    lambda copy: opportunistic(storage, "buffer snapshot", lambda: snapshots.write(copy, start)),
                )
            else:
                opportunistic(storage, "buffer snapshot", lambda: snapshots.write(buffer, start))

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
        recorded = self.buffer.lost_outcomes.get(txn, ONGOING)
        if recorded != ONGOING:  # open when a lost entry was passed, which may have held its marker
            return self._decide_after_loss(txn, recorded)
        status = self.resolver(txn, functools.partial(self.first_write_ms, txn))
        if status.state is None or status.state == CoordinatorState.COMPLETE_COMMIT:
            # Finished: every participant has its marker, so this partition's marker lies ahead of the
            # data -- unless the data is a zombie write that landed after the marker (whose record aged
            # out of the buffer's cache of ended transactions). Scan ahead to tell them apart.
            blocked = self._scan_for_marker(txn)
            outcome = self.buffer.outcome(txn)
            if outcome is not None:
                self.decisions[txn] = outcome
                return outcome
            recorded = self.buffer.lost_outcomes.get(txn, ONGOING)
            if recorded != ONGOING:  # the scan passed a lost entry (a hole), which may have held its marker
                return self._decide_after_loss(txn, recorded)
            if not blocked:
                # No marker after the data: these writes came after the transaction ended. They become
                # skip ranges (persisted, so every reader and range plan drops them the same way).
                self._drop_zombie_writes(txn)
                return True
            # Its marker may lie behind a damaged entry this state stops at (PROTOCOL.md "Damage"): a
            # commit the transaction log still knows is a commit; an outcome nobody knows waits for it.
            if status.state is None:
                return None
        if status.decided:
            # Data in a partition the transaction never registered is not part of it (the writer broke
            # the protocol); it is dropped now and after completion alike.
            committed = status.committed and (not status.participants or self.log.path in status.participants)
            self.decisions[txn] = committed
            return committed
        return None

    def first_write_ms(self, txn: TxnId) -> int | None:
        """When ``txn``'s first entry in this partition was written (its header's timestamp), while the buffer
        holds it ongoing: kept by the buffer, or read from that entry's header where a snapshot older than
        the field left it unknown. None when it is not ongoing here."""
        ongoing = self.buffer.by_txn.get(txn)
        if ongoing is None:
            return None
        if ongoing.first_ms is None:
            ongoing.first_ms = self.log.read_header(self.log.slot_for_offset(ongoing.first_offset)).timestamp_ms
        return ongoing.first_ms

    def start_ms(self, txn: TxnId, status: TxnStatus | None) -> int | None:
        """When ``txn`` started as this partition's readers count its timeout: its start in the transaction
        log (``status``), or, begun ahead (no start there), its first write here (PROTOCOL.md "Timeouts")."""
        if status is None:
            return None
        return status.start_ms if status.start_ms is not None else self.first_write_ms(txn)

    def _decide_after_loss(self, txn: TxnId, recorded: str | None) -> bool | None:
        """Decide a transaction whose marker may be in a lost entry (PROTOCOL.md "Damage"): a marker after
        it decides; else the outcome the lost-entry record gives (none recorded: the transaction log now).
        An outcome nobody knows any more delivers nothing: it cannot be shown committed."""
        blocked = self._scan_for_marker(txn)
        if txn not in self.buffer.by_txn:
            return self.buffer.outcome(txn) is not False
        if blocked and recorded in (None, UNKNOWN):
            return None  # its marker may lie behind a damaged entry further on: wait for it
        if recorded is None:
            status = self.resolver(txn, functools.partial(self.first_write_ms, txn))
            if status.state is not None and not status.decided:
                return None
            committed = status.committed and (not status.participants or self.log.path in status.participants)
            recorded = UNKNOWN if status.state is None else COMMIT if committed else ABORT
        if recorded == UNKNOWN:
            logger.warning(
                "%s: transaction %s was open before lost offsets and its outcome is no longer known; "
                "read_committed readers deliver none of its records here",
                self.log.path,
                txn,
            )
        self.decisions[txn] = recorded == COMMIT
        return recorded == COMMIT

    def _drop_zombie_writes(self, txn: TxnId) -> None:
        buffer = self.buffer
        ongoing = buffer.by_txn.get(txn)
        if ongoing is None:
            return
        entries = []
        for slot in range(self.log.slot_for_offset(ongoing.first_offset), buffer.slot):
            try:
                header = self.log.read_header(slot)
            except DamagedEntryError:
                continue  # passed by this reader's choice: whatever it held is not delivered
            if header.txn == txn and not header.is_control:
                entries.append((header.base_offset, header.last_offset))
        buffer.drop_incarnation(txn, entries)

    def _scan_for_marker(self, txn: TxnId, max_entries: int | None = None) -> bool:
        """Apply entries until ``txn`` ends (at most ``max_entries``); True if a damaged entry stopped it (or,
        scanning without a bound, a hole: a missing slot with entries after it)."""
        buffer = self.buffer
        n = 0
        reread = -1  # the slot whose miss was read again
        while txn in buffer.by_txn and (max_entries is None or n < max_entries):
            n += 1
            try:
                step = self.next_entry(self.headers.next)
            except ObjectNotFoundError:
                # The end as far as this reader knows, or a hole it has not learnt of yet (PROTOCOL.md
                # "Damage"). A full scan decides from where it stops (a finished transaction with no marker
                # before the end is taken for a zombie write and dropped), so it reads the slot once more
                # (a read issued ahead may predate the marker, which has landed since: the miss is stale;
                # the read-ahead issues a fresh read after a miss), and reads a hole as one.
                if max_entries is not None:
                    return False
                if reread != buffer.slot:
                    reread = buffer.slot
                    continue
                if not self._hole_at(buffer.slot):
                    return False
                step = self._past_hole(buffer.slot)
            if step is None:
                return True
            header, lost = step
            self.apply(buffer.slot, header, HEADER_SIZE + header.payload_len, lost)
        return False

    def _hole_at(self, slot: int) -> bool:
        """Whether the missing ``slot`` where a full scan stopped is a hole. The answer "no" holds for
        LOG_START_RECHECK_S at that slot, the time a reader takes to learn of a hole anyway: a reader
        polling at the end does not pay the hole probes at every poll."""
        now = self.log.monotonic()
        checked = self._not_hole
        if checked is not None and checked[0] == slot and now - checked[1] < partition_module.LOG_START_RECHECK_S:
            return False
        if self.log.is_hole(slot):
            return True
        self._not_hole = (slot, now)
        return False

    def _past_hole(self, slot: int) -> tuple[EntryHeader, LostEntry | None] | None:
        """What :meth:`next_entry` gives for the hole at ``slot``: its lost record (marked lost, or passed by
        this reader's choice), or None when it stops this state there (:attr:`damage` names it)."""
        marked = self.log.lost_entry(slot)
        if marked is not None:
            return marked.header(), marked
        return self._past_damage(self.log.damaged(slot, self.log.missing_check(slot)))

    def read_bound(self) -> int:
        """The last stable offset: first offset of the earliest undecided ongoing transaction."""
        buffer = self.buffer
        for first, ongoing in list(buffer.ongoing.items()):
            if ongoing.txn not in buffer.by_txn:
                continue  # ended by a marker found while deciding an earlier one
            if self.decide(ongoing.txn) is None:
                return int(first)
        return buffer.position

    def scanned_bound(self) -> int:
        """Scanned to a fresh log end: the read bound (last stable offset) as of now.

        A fresh tail first, so the scan tells a hole from the log end; then scans until deciding adds
        nothing (deciding may abort a transaction past its timeout, writing markers the next scan reads)."""
        self.log.readable_tail(refresh=True)
        for _ in range(3):
            self.scan_to_end()
            before = self.buffer.position
            self.read_bound()
            self.scan_to_end()
            if self.buffer.position == before:
                break
        return self.read_bound()

    def end_offset(self) -> int:
        """The log end as this state knows it: its buffer's position, or the readable end when a scan
        stopped at damage (what a ``read_uncommitted`` reader can reach)."""
        return self.buffer.position if self.damage is None else self.log.readable_end()

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
        if header.kind is EntryKind.LOST:
            return Disposition.LOST
        buffer = self.buffer
        aborted = buffer.aborted.get(header.txn) if header.txn is not None else None
        if aborted is not None and header.base_offset > aborted.marker_offset:
            return Disposition.ABORTED  # a zombie write after the abort marker, as apply() classed it
        if buffer.skips.covers(header.base_offset):
            return Disposition.SKIP
        if header.txn is None:
            return Disposition.DATA
        if aborted is not None:  # one lookup of the aborted index per entry (a history read makes many)
            return Disposition.ABORTED
        return Disposition.TXN_DATA

    def filters(self, start: int, end: int) -> tuple[list[int], list[tuple[int, int]]]:
        """Aborted transaction keys and skip ranges a reader of ``[start, end)`` must drop.

        Includes transactions aborted by the coordinator whose marker has not reached this partition.
        """
        from txn_core.partition.aborted import txn_key

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
        from txn_core.partition.aborted import txn_key

        for offset, gap in self.buffer.gaps.items():
            if not start <= offset < end or any(f <= offset <= last for f, last in skips):
                continue
            slot = self.log.slot_for_offset(offset)
            header = self.log.read_header(slot)
            if header.txn is not None and txn_key(header.txn) in aborted:
                continue
            raise gap_error(self.log.path, offset, *gap)
