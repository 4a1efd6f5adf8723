"""One coordinator partition of the transaction log: records, state, replay (PROTOCOL.md "Transaction log").

The transaction log is split into coordinator partitions by ``crc32(transactional id) % N``. Each one is
a slot log ``_txnlog/coordinators/<05d c>/log/<020d slot>`` of records
(:class:`~txn_core.coordinator.actions.Record`); a record is a list of typed actions, each naming its
transactional id, applied atomically in order by :func:`~txn_core.coordinator.apply.apply`:

=========  ====================================================================================
action     effect
=========  ====================================================================================
init       new producer id or epoch for the id -> Empty
begin      a transaction starts -> Ongoing; its TxnId is (coordinator, slot of this record); from
           Prepare* the previous transaction becomes the id's completing one
add        participants (log paths) added to the ongoing transaction -> Ongoing
prepare    the decision, COMMIT or ABORT -> PrepareCommit / PrepareAbort (may bump the epoch: fencing)
complete   every participant has its marker -> CompleteCommit / CompleteAbort, epoch + 1 (KIP-890)
=========  ====================================================================================

A writer computes the next state from the state at slot ``n - 1`` (it has replayed every earlier slot)
with the same :func:`~txn_core.coordinator.apply.apply` that replay uses, then creates slot ``n``. If
another writer took slot ``n`` it replays it and recomputes, so every record in the log is a valid
transition of the state before it (prepare, persist, then change memory: :meth:`CoordinatorPartition._fold`
computes, :meth:`CoordinatorPartition._commit` changes memory, for replay and writers alike).

State is rebuilt from the newest coordinator snapshot plus the slots after it. The low watermark is the
smallest sequence of a transaction that is not complete; everything below it is finished.

This module holds the replayed state of a partition, its replay (:meth:`CoordinatorPartition.refresh`)
and its queries. The partition hands the rest to helpers given what they need:
:mod:`~txn_core.coordinator.groupcommit` batches appends into records,
:mod:`~txn_core.coordinator.snapshots` writes and loads snapshots and compacts the log,
:mod:`~txn_core.coordinator.holes` tells a hole from the end of the log, and
:mod:`~txn_core.coordinator.txnindex` indexes transactions by id (open ones, recent outcomes).

Crash windows: memory changes only after a record is durable (created, or read by replay), so a process
that dies at any point leaves a log every participant replays to the same state. A record missing below a
present one is a hole (PROTOCOL.md "Damage"), never the end of the log: nothing is written into its slot.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from txn_core.clock import Clock, monotonic
from txn_core.coordinator.actions import Action, Begin, Record
from txn_core.coordinator.apply import Step, apply
from txn_core.coordinator.groupcommit import Build, GroupCommit
from txn_core.coordinator.holes import HoleProbe, damaged
from txn_core.coordinator.snapshots import COMPACTION_MIN_AGE_MS, CoordinatorSnapshots, Snapshot, snapshot_value
from txn_core.coordinator.tidstate import Completing, TidState
from txn_core.coordinator.txnindex import TxnIndex, txn_key
from txn_core.errors import CorruptDataError, ObjectExistsError, ObjectNotFoundError, TxnLogError
from txn_core.format import envelope, paths
from txn_core.format.ids import TxnId
from txn_core.format.slotlog import SlotLog
from txn_core.format.states import CoordinatorState, TxnStatus
from txn_core.storage.base import Storage, create_resolving
from txn_core.storage.parallel import submit

__all__ = [
    "COMPACTION_MIN_AGE_MS",
    "Completing",
    "CoordinatorPartition",
    "CoordinatorViews",
    "TidState",
    "TxnStatus",
    "apply",
]

#: Completed transactions whose outcome each coordinator keeps for readers (beyond the low watermark).
RECENT_OUTCOMES = 50_000
#: A finished transactional id idle this long (coordinator log time) expires (Kafka's
#: transactional.id.expiration.ms default) unless its last committed metadata is kept (see _expired).
TID_EXPIRATION_MS = 7 * 24 * 3600 * 1000
#: Expiry runs whenever log time enters a new step of this length.
TID_EXPIRY_STEP_MS = 3600 * 1000
#: Commit metadata with this key set to true marks a one-shot id (a batch write): it may expire.
EPHEMERAL_KEY = "ephemeral"
_FINISHED = frozenset(
    {CoordinatorState.EMPTY, CoordinatorState.COMPLETE_COMMIT, CoordinatorState.COMPLETE_ABORT, CoordinatorState.DEAD}
)


def _expired(st: TidState, now: int) -> bool:
    """Whether ``st`` expires at log time ``now``: finished, idle past the expiration, and holding no
    progress an application relies on (no last committed metadata, or metadata marked ephemeral)."""
    if st.state not in _FINISHED or st.ahead is not None or now - st.updated_ms <= TID_EXPIRATION_MS:
        return False
    kept = st.last_committed
    return kept is None or kept.get(EPHEMERAL_KEY) is True


class CoordinatorPartition:
    """Replayed state of one coordinator partition; appends validated records. Thread-safe.

    It owns the state (``tids``; ``txns``, the :class:`~txn_core.coordinator.txnindex.TxnIndex` of its
    transactions; ``next_slot``; ``log_time_ms``) and the lock that guards it, and gives its helpers what
    they need: :class:`~txn_core.coordinator.groupcommit.GroupCommit` queues appends and calls back
    (:class:`~txn_core.coordinator.groupcommit.RecordLog`) to fold and create each record;
    :class:`~txn_core.coordinator.snapshots.CoordinatorSnapshots` loads, writes and compacts;
    :class:`~txn_core.coordinator.holes.HoleProbe` looks past a missing slot.

    Invariants (:meth:`_check`): those of the index (:meth:`TxnIndex.check
    <txn_core.coordinator.txnindex.TxnIndex.check>`: exactly the transactions that are not complete are open
    in it, no two sharing an id, at most :data:`RECENT_OUTCOMES` outcomes); every transaction id's sequence
    is below ``next_slot``; the newest snapshot's slot is not past it.
    """

    def __init__(self, storage: Storage, coordinator: int, *, clock: Clock) -> None:
        self.storage = storage
        self.coordinator = coordinator
        self.slots = SlotLog(storage, paths.coordinator_log(coordinator))
        self.clock: Clock = clock
        self._monotonic = monotonic(clock)
        self._lock = threading.RLock()
        self.next_slot = -1  # -1: not loaded yet
        self.tids: dict[str, TidState] = {}
        self.txns = TxnIndex(RECENT_OUTCOMES)
        self._snapshots = CoordinatorSnapshots(storage, coordinator, self.slots, clock, self._lock)
        #: appends waiting for the next record (group commit; see :meth:`append`)
        self._appends = GroupCommit(self, self._lock, clock)
        self._last_refresh = self._monotonic()
        self._holes = HoleProbe(self.slots, coordinator, self._snapshots, self._monotonic)
        #: coordinator log time: the newest record timestamp applied; finished ids expire by it
        self.log_time_ms = 0

    # --- replay ---------------------------------------------------------------------------------

    def _load(self) -> None:
        """Start from the newest readable snapshot (its state and slot), else from slot 0."""
        state = self._snapshots.load()
        if state is None:
            self.next_slot = 0
            return
        self.next_slot = state.next_slot
        self.tids = state.tids
        self.txns = TxnIndex.of(self.tids.values(), state.outcomes, RECENT_OUTCOMES)
        self.log_time_ms = state.log_time_ms

    def refresh(self) -> None:
        """Apply every record written since the last refresh (one GET per new slot, plus one miss).

        A missing slot with a later record present is a **hole** (a record deleted by hand, or lost by the
        store), never the end: an append there would take the slot of a decision the records after it were
        built on. The first refresh of a view, and one every :data:`~txn_core.coordinator.holes.HOLE_RECHECK_S`,
        asks beside each read whether the next slot exists (one request more per read, no round trip more); a
        hole raises the record's damage (:meth:`HoleProbe.confirm <txn_core.coordinator.holes.HoleProbe.confirm>`)."""
        with self._lock:
            if self.next_slot < 0:
                self._load()
            probe = self._holes.due()
            reloaded_for: int | None = None  # the missing slot a reload was made for: once per slot
            while True:
                after = submit(self.slots.exists, self.next_slot + 1, leaf=True) if probe else None
                try:
                    data = self.slots.read(self.next_slot)
                except ObjectNotFoundError:
                    if self._compacted_past_us():
                        self._load()
                        continue
                    if after is None or not after.result():
                        break
                    found = self._holes.confirm(self.next_slot, compaction=reloaded_for != self.next_slot)
                    if found is None:  # compaction removed it: start again from the newest snapshot
                        reloaded_for = self.next_slot
                        self._load()
                        continue
                    data = found
                self._apply_record(self.next_slot, data)
                self.next_slot += 1
            snapshot = self.snapshot_due()
        if snapshot is not None:
            self.maintain(snapshot)

    def _current_enough(self) -> bool:
        """Whether an append may create at ``next_slot`` without first reading it (PROTOCOL.md "Transaction
        log", appends): the view is loaded and learned within half the compaction age that ``next_slot``
        was free. Then a record another writer put there since is younger than the compaction age, so
        it still exists and the create itself reports the conflict (and the append replays and retries);
        a slot reused after compaction cannot happen."""
        return self.next_slot >= 0 and self._monotonic() - self._last_refresh < COMPACTION_MIN_AGE_MS / 2000

    def _compacted_past_us(self) -> bool:
        """Whether compaction deleted slots this view has not applied yet (only possible when the view
        was idle for longer than half the compaction age; see PROTOCOL.md "Compaction")."""
        now = self._monotonic()
        idle, self._last_refresh = now - self._last_refresh, now
        if idle < COMPACTION_MIN_AGE_MS / 2000:
            return False
        return self._snapshots.newest_slot() > self.next_slot

    def _apply_record(self, slot: int, data: bytes) -> None:
        key = self.slots.key(slot)
        try:
            record = Record.from_json(envelope.decode(data, key, envelope.ObjectKind.COORDINATOR_RECORD).json(key), key)
            try:
                steps = self._fold(record.actions, slot, record.ts)
            except TxnLogError as exc:
                raise CorruptDataError(f"{key}: record is not a valid transition: {exc}", key) from exc
        except CorruptDataError as exc:
            raise damaged(exc, key, self.coordinator) from exc
        self._commit(steps, record.ts)

    def _fold(
        self,
        actions: Sequence[Action],
        slot: int,
        ts: int,
        states: dict[str, TidState | None] | None = None,
        taken: frozenset[int] = frozenset(),
    ) -> list[Step]:
        """The steps ``actions`` in a record at ``slot`` make, computed without changing anything: ``(tid,
        before, after)`` per action, in order, starting from ``states`` (ids' states after earlier actions of
        the same record) or the replayed state. A begin's transaction is ``(coordinator, slot, its index)``;
        ``taken`` holds the indexes of begins earlier in the record. Raises if an action is not valid, or two
        begins of the record have the same index other than 0 (0 repeats only in records written before
        indexes existed: their begins share the id ``(coordinator, slot)``, as written)."""
        steps: list[Step] = []
        local = dict(states or {})
        seen = set(taken)
        for action in actions:
            before = local[action.tid] if action.tid in local else self.tids.get(action.tid)
            if isinstance(action, Begin):
                index = action.index or 0
                if index and index in seen:
                    raise TxnLogError(f"two begins of one transaction log record have index {index}")
                seen.add(index)
            after = apply(before, action, self.coordinator, slot, ts)
            steps.append((action.tid, before, after))
            local[action.tid] = after
        return steps

    def _commit(self, steps: list[Step], ts: int) -> None:
        """Make the steps of a durable record (replayed or just created) the state: per action, as replay
        does, so a completion folded into a later action keeps its outcome."""
        for tid, before, after in steps:
            self.txns.note(before, after)
            self.tids[tid] = after
        self._advance_time(ts)

    def _advance_time(self, ts: int) -> None:
        """Move log time to ``ts``; entering a new step of it, drop expired transactional ids (PROTOCOL.md
        "Transaction log", expiry). Applied after every record, by replay and by the writer alike, so the
        state stays a function of the log."""
        if ts <= self.log_time_ms:
            return
        crossed = ts // TID_EXPIRY_STEP_MS != self.log_time_ms // TID_EXPIRY_STEP_MS
        self.log_time_ms = ts
        if not crossed:
            return
        for tid in [t for t, st in self.tids.items() if _expired(st, ts)]:
            del self.tids[tid]

    def _check(self) -> None:
        """Assert the invariants (the randomised model test calls it after every step)."""
        with self._lock:
            self.txns.check(self.tids.values())
            for st in self.tids.values():
                st.check()
                for txn in (st.txn, st.completing.txn if st.completing else None):
                    assert txn is None or (txn.coordinator == self.coordinator and txn.sequence < self.next_slot), st
            assert 0 <= self._snapshots.slot <= max(self.next_slot, 0)

    # --- queries --------------------------------------------------------------------------------

    def low_watermark(self) -> int:
        """The smallest sequence of a transaction that is not complete (else the next slot)."""
        with self._lock:
            oldest = self.txns.oldest_open()
            return self.next_slot if oldest is None else oldest

    def state(self, tid: str) -> TidState | None:
        with self._lock:
            return self.tids.get(tid)

    def prepared(self, txn: TxnId) -> TidState | None:
        """The decided, incomplete transaction ``txn`` as its completer sees it (state, epoch,
        participants), whether it is its id's current or completing one; None otherwise."""
        with self._lock:
            tid = self._open_tid(txn)
            st = self.tids.get(tid) if tid is not None else None
            return st.prepared(txn) if st is not None else None

    def status(self, txn: TxnId) -> TxnStatus | None:
        """The status of ``txn`` as of the last refresh; None if this view has not seen it yet."""
        with self._lock:
            if txn.sequence >= self.next_slot:
                return None
            tid = self._open_tid(txn)
            if tid is not None:
                st = self.tids[tid]
                st = st.seen_by(txn)  # begun ahead: Ongoing to readers, its start unknown here
                if st.txn == txn:
                    return TxnStatus(txn, st.state, tid, st.start_ms, st.timeout_ms, st.participants)
                c = st.completing
                if c is not None and c.txn == txn:
                    return TxnStatus(txn, c.state, tid, 0, st.timeout_ms, c.participants)
            final = self.txns.outcome(txn)
            if final is not None:
                return TxnStatus(txn, final)
            return TxnStatus(txn, None)

    def _open_tid(self, txn: TxnId) -> str | None:
        """Under the lock: the transactional id whose open transaction is ``txn``, if any. Of the ids of a
        record written before indexes existed, whose begins share ``txn``, one whose transaction is decided
        comes first (so it is completed after its grace, not held until the other times out), else the first
        by name."""
        tids = self.txns.open_tids(txn)
        if len(tids) > 1:
            decided = [t for t in tids if self.tids[t].prepared(txn) is not None]
            return (decided or tids)[0]
        return tids[0] if tids else None

    def predict_next(self) -> TxnId | None:
        """The id the next record would give a begin appended now, when this view may append without reading
        first and no append of this process is queued or in flight; else None. A guess, read unlocked."""
        if self._appends.queued() or not self._current_enough() or not self._lock.acquire(blocking=False):
            return None
        try:
            return TxnId(self.coordinator, self.next_slot)
        finally:
            self._lock.release()

    def open_states(self) -> list[TidState]:
        """Every transaction that is not complete, as its id's state (a completing one as its completer
        sees it, :meth:`TidState.prepared`; one begun ahead as the current one it would be,
        :meth:`TidState.activated`: Ongoing, start unknown), oldest first."""
        with self._lock:
            out = []
            for key, tid in self.txns.open_items():
                st = self.tids[tid]
                if st.ahead is not None and txn_key(st.ahead.txn) == key:
                    out.append(st.activated())
                elif st.txn is not None and txn_key(st.txn) == key:
                    out.append(st)
                elif st.completing is not None:
                    view = st.prepared(st.completing.txn)
                    if view is not None:
                        out.append(view)
            return out

    # --- append (group commit) -------------------------------------------------------------------

    def append(self, tid: str, build: Build, *, fallback: Build | None = None) -> TidState | None:
        """Append the actions ``build(current state)`` returns, validated against the latest state.

        ``build`` is called again after every lost race with the then-current state; it may raise (e.g.
        the producer was fenced meanwhile) or return None or nothing (nothing to do any more). Returns the
        id's new state. Snapshot maintenance runs after the record landed and cannot fail the append.

        Appends of this process that wait while a record is being created go into the next record together
        (**group commit**, :mod:`~txn_core.coordinator.groupcommit`), each caller with its own result or
        error. A begin that does not fit into that record (:data:`~txn_core.format.ids.MAX_BEGINS_PER_RECORD`)
        waits for the next one, unless the append gives a ``fallback``, the actions it takes without its
        begin (a decision that would begin the next transaction ahead goes alone rather than wait); the
        fallback also serves if the actions with the begin are not valid.
        """
        return self._appends.append(tid, build, fallback)

    def queued(self) -> int:
        """How many appends of this process wait for the next record; read unlocked, a guess."""
        return self._appends.queued()

    def prepare_append(self) -> None:
        """Under the lock, before an append: read the log first unless :meth:`_current_enough`."""
        if not self._current_enough():
            self.refresh()

    def fold_next(
        self, actions: Sequence[Action], ts: int, states: dict[str, TidState | None], taken: frozenset[int]
    ) -> list[Step]:
        """Under the lock: the steps ``actions`` make in a record at the next slot (:meth:`_fold`)."""
        return self._fold(actions, self.next_slot, ts, states, taken)

    def create_next(self, record: Record, steps: list[Step]) -> bool:
        """Under the lock: create the next slot holding ``record``, whose ``steps`` :meth:`fold_next` gave,
        and only then make them the state. False if another writer took the slot: it is replayed, and the
        caller folds its actions again."""
        header, payload = envelope.encode_json(envelope.ObjectKind.COORDINATOR_RECORD, record.to_json())
        try:
            create_resolving(self.storage, self.slots.key(self.next_slot), [header, payload], header)
        except ObjectExistsError:
            self.refresh()
            return False
        self._commit(steps, record.ts)
        self.next_slot += 1
        self._last_refresh = self._monotonic()  # the slot was free: nothing older was compacted away
        return True

    # --- snapshots and compaction (CoordinatorSnapshots) --------------------------------------------

    def snapshot_due(self) -> Snapshot | None:
        """Under the lock: the snapshot to write now (the log grew
        :data:`~txn_core.coordinator.snapshots.SNAPSHOT_EVERY` records past the newest one), or None.
        Claims it so one thread of this process writes it (:meth:`maintain`)."""
        return self._snapshot_value() if self._snapshots.claim(self.next_slot) else None

    def _snapshot_value(self) -> Snapshot:
        return snapshot_value(
            self.coordinator,
            self.next_slot,
            self.low_watermark(),
            self.tids.values(),
            self.txns.outcomes,
            self.log_time_ms,
            self.clock(),
        )

    def maintain(self, snapshot: Snapshot) -> None:
        """Write a snapshot :meth:`snapshot_due` gave, outside the lock; a failure is logged, never raised."""
        self._snapshots.maintain(snapshot)

    def snapshot_now(self) -> int:
        """Write a snapshot at the current tail (maintenance); returns its slot."""
        with self._lock:
            self.refresh()
            if self._snapshots.slot == self.next_slot:
                return self.next_slot
            snap = self._snapshot_value()
        self._snapshots.write(snap)
        return int(snap["next_slot"])

    def compact(self, min_age_ms: int = COMPACTION_MIN_AGE_MS) -> int:
        """Delete log slots below the newest snapshot that are older than ``min_age_ms``; returns count."""
        with self._lock:
            self.refresh()
            limit = self._snapshots.slot
        return self._snapshots.compact(limit, min_age_ms)


@dataclass
class CoordinatorViews:
    """The coordinator partitions of one log, created lazily (one per process and log)."""

    storage: Storage
    clock: Clock
    _views: dict[int, CoordinatorPartition] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, coordinator: int) -> CoordinatorPartition:
        with self._lock:
            view = self._views.get(coordinator)
            if view is None:
                view = CoordinatorPartition(self.storage, coordinator, clock=self.clock)
                self._views[coordinator] = view
            return view

    def check(self) -> None:
        """Every loaded view's invariants (:meth:`CoordinatorPartition._check`)."""
        with self._lock:
            views = list(self._views.values())
        for view in views:
            view._check()
