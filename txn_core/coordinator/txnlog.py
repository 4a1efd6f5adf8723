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
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

from sortedcontainers import SortedDict

from txn_core.clock import Clock, monotonic
from txn_core.coordinator.actions import Action, Begin, Record
from txn_core.coordinator.apply import apply
from txn_core.coordinator.tidstate import Completing, TidState
from txn_core.errors import (
    CorruptDataError,
    ObjectExistsError,
    ObjectNotFoundError,
    TxnLogError,
)
from txn_core.format import envelope, paths
from txn_core.format.ids import MAX_BEGINS_PER_RECORD, TxnId
from txn_core.format.slotlog import SlotLog
from txn_core.format.states import CoordinatorState, TxnStatus
from txn_core.logs import get_logger
from txn_core.storage.base import Storage, create_resolving
from txn_core.storage.guarded import opportunistic
from txn_core.storage.parallel import submit

__all__ = ["Completing", "CoordinatorPartition", "CoordinatorViews", "TidState", "TxnStatus", "apply"]

_C = CoordinatorState
#: Completed transactions whose outcome each coordinator keeps for readers (beyond the low watermark).
RECENT_OUTCOMES = 50_000
#: A snapshot is written when the log has grown this many records past the newest one.
SNAPSHOT_EVERY = 500
#: Snapshots kept (older ones are deleted once a newer one exists).
SNAPSHOTS_KEPT = 2
#: Compaction deletes only records older than this; a view idle for half of it re-checks snapshots.
COMPACTION_MIN_AGE_MS = 3600 * 1000
#: How often a view's refresh also asks whether a record follows the slot it finds missing (a hole,
#: PROTOCOL.md "Damage"): at its first refresh, then at most this often (seconds).
HOLE_RECHECK_S = 5.0


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


def _key(txn: TxnId) -> tuple[int, int]:
    """A transaction's key in one coordinator partition's indexes: (sequence, index in its record)."""
    return txn.sequence, txn.index


def _open_key(txn: TxnId, tid: str) -> tuple[int, int, str]:
    """A transaction's key in ``open_txns``: its :func:`_key` and its transactional id. The id is part of
    the key because the begins of a record written before ids had an index share one id (PROTOCOL.md
    "Group commit"); for every other record the first two parts alone are unique."""
    return txn.sequence, txn.index, tid


def _numbered(actions: Sequence[Action], begins: int) -> list[Action]:
    """``actions`` with each begin given its index in a record that holds ``begins`` begins before them."""
    out: list[Action] = []
    for action in actions:
        if isinstance(action, Begin):
            out.append(replace(action, index=begins or None))  # the first one's 0 is not written
            begins += 1
        else:
            out.append(action)
    return out


def _finished(before: TidState | None, after: TidState) -> list[tuple[TxnId, CoordinatorState]]:
    """The transactions a step completed, with their final state: the current one reaching Complete*, or
    the completing one leaving."""
    out: list[tuple[TxnId, CoordinatorState]] = []
    if (
        before is not None
        and before.completing is not None
        and (after.completing is None or after.completing.txn != before.completing.txn)
    ):
        c = before.completing
        out.append((c.txn, CoordinatorState.COMPLETE_COMMIT if c.committed else CoordinatorState.COMPLETE_ABORT))
    a = before.ahead if before is not None else None
    if (
        a is not None
        and after.ahead is None
        and after.txn != a.txn
        and (after.completing is None or after.completing.txn != a.txn)
    ):
        out.append((a.txn, CoordinatorState.COMPLETE_ABORT))  # withdrawn unused: nothing of it exists
    complete = after.state in (CoordinatorState.COMPLETE_COMMIT, CoordinatorState.COMPLETE_ABORT)
    if (
        after.txn is not None
        and complete
        and (before is None or (before.txn, before.state) != (after.txn, after.state))
    ):
        out.append((after.txn, after.state))
    return out


class CoordinatorPartition:
    """Replayed state of one coordinator partition; appends validated records. Thread-safe.

    Invariants (:meth:`_check`): no two transactions share an id (each begin of a record has its index;
    records written before indexes existed are the exception, replayed as written); ``open_txns`` holds the
    key (:func:`_open_key`: sequence, index, transactional id) of every transaction that is not complete
    (each id's current and completing ones, or a reservation), mapped to its id, and nothing else; ``outcomes``
    holds at most
    :data:`RECENT_OUTCOMES` final states; every transaction id's sequence is below ``next_slot``.
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
        self.open_txns: SortedDict = SortedDict()  # (sequence, index, tid) -> tid, transactions not complete
        self.outcomes: OrderedDict[tuple[int, int], CoordinatorState] = OrderedDict()  # (seq, index) -> final
        self._snapshot_slot = 0
        self._snapshotting = False
        #: appends waiting for the next record (group commit; see :meth:`append`)
        self._queue: list[_Append] = []
        self._queue_lock = threading.Lock()
        self._last_refresh = self._monotonic()
        self._hole_checked: float | None = None  # when a refresh last probed past the slot it missed
        #: coordinator log time: the newest record timestamp applied; finished ids expire by it
        self.log_time_ms = 0

    # --- replay ---------------------------------------------------------------------------------

    def _load(self) -> None:
        prefix = paths.coordinator_snapshots(self.coordinator)
        names = sorted(n for n in self.storage.list(prefix) if not n.endswith("/"))
        for name in reversed(names):
            try:
                snap = envelope.read_json(self.storage, prefix + name, envelope.ObjectKind.COORDINATOR_SNAPSHOT)
            except (ObjectNotFoundError, CorruptDataError):
                continue  # a newer snapshot raced a delete, or a damaged one: use an older one
            self._restore(snap)
            return
        self.next_slot = 0

    def _restore(self, snap: dict[str, Any]) -> None:
        self.next_slot = int(snap["next_slot"])
        self._snapshot_slot = self.next_slot
        self.tids = {t["tid"]: TidState.from_json(t) for t in snap["tids"]}
        self.open_txns = SortedDict()
        for st in self.tids.values():
            for txn in st.open_txns():
                self.open_txns[_open_key(txn, st.tid)] = st.tid
        # [sequence, state] for a transaction whose index in its record is 0, [sequence, state, index] else
        self.outcomes = OrderedDict(
            ((int(o[0]), int(o[2]) if len(o) > 2 else 0), CoordinatorState(o[1])) for o in snap["outcomes"]
        )
        self.log_time_ms = int(snap.get("log_time_ms", max((t.updated_ms for t in self.tids.values()), default=0)))

    def refresh(self) -> None:
        """Apply every record written since the last refresh (one GET per new slot, plus one miss).

        A missing slot with a later record present is a **hole** (a record deleted by hand, or lost by the
        store), never the end: an append there would take the slot of a decision the records after it were
        built on. The first refresh of a view, and one every :data:`HOLE_RECHECK_S`, asks beside each read
        whether the next slot exists (one request more per read, no round trip more); a hole raises the
        record's damage (:meth:`_confirm_hole`)."""
        with self._lock:
            if self.next_slot < 0:
                self._load()
            probe = self._hole_check_due()
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
                    found = self._confirm_hole(self.next_slot, compaction=reloaded_for != self.next_slot)
                    if found is None:  # compaction removed it: start again from the newest snapshot
                        reloaded_for = self.next_slot
                        self._load()
                        continue
                    data = found
                self._apply_record(self.next_slot, data)
                self.next_slot += 1
            snapshot = self._snapshot_due()
        if snapshot is not None:
            self._maintain(snapshot)

    def _hole_check_due(self) -> bool:
        now = self._monotonic()
        if self._hole_checked is not None and now - self._hole_checked < HOLE_RECHECK_S:
            return False
        self._hole_checked = now
        return True

    def _confirm_hole(self, slot: int, *, compaction: bool = True) -> bytes | None:
        """``slot`` was missing while ``slot + 1`` was present. Read it again, asked after the later one was
        seen: a record created between the two requests is no hole (returned). With ``compaction``, a snapshot
        listed past it means compaction may have removed it (None: reload from the newest readable snapshot;
        the caller asks so once per slot, since a reload that lands below the slot again, the newer snapshot
        unreadable, would otherwise go round for ever). Otherwise it is a hole: slot ``n + 1`` is only
        created by a writer that replayed slot ``n``, and only compaction deletes records; raise its damage."""
        try:
            return self.slots.read(slot)
        except ObjectNotFoundError:
            pass
        if compaction and self._newest_snapshot() > slot:
            return None
        key = self.slots.key(slot)
        check = "missing: the record is gone although later records exist"
        raise self._damaged(CorruptDataError(f"{key}: {check}.", key, check), key, missing=True)

    def _newest_snapshot(self) -> int:
        """The slot of the newest snapshot listed (0 without one)."""
        names = self.storage.list(paths.coordinator_snapshots(self.coordinator))
        return max((int(n) for n in names if n.isdigit()), default=0)

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
        return self._newest_snapshot() > self.next_slot

    def _apply_record(self, slot: int, data: bytes) -> None:
        key = self.slots.key(slot)
        try:
            record = Record.from_json(envelope.decode(data, key, envelope.ObjectKind.COORDINATOR_RECORD).json(key), key)
            try:
                steps = self._fold(record.actions, slot, record.ts)
            except TxnLogError as exc:
                raise CorruptDataError(f"{key}: record is not a valid transition: {exc}", key) from exc
        except CorruptDataError as exc:
            raise self._damaged(exc, key) from exc
        self._commit(steps, record.ts)

    def _damaged(self, exc: CorruptDataError, key: str, *, missing: bool = False) -> CorruptDataError:
        """What a damaged (or ``missing``) record stops, and the way out: the transaction log holds the
        decisions, which nothing else can rebuild (PROTOCOL.md "Damage")."""
        last = (
            "Nothing is written into its slot meanwhile: a record there would replace the one the records after it "
            "were built on."
            if missing
            else "Do not delete it: the records after it would be overwritten."
        )
        return CorruptDataError(
            f"{exc} It is a record of the transaction log of coordinator partition {self.coordinator}: until it "
            "is restored from a backup of that object, the transactional ids of this coordinator partition can "
            "neither begin nor end transactions, and readers cannot decide their open ones (other coordinator "
            f"partitions are unaffected). {last}",
            key,
            exc.check,
        )

    def _fold(
        self,
        actions: Sequence[Action],
        slot: int,
        ts: int,
        states: dict[str, TidState | None] | None = None,
        taken: frozenset[int] = frozenset(),
    ) -> list[tuple[str, TidState | None, TidState]]:
        """The steps ``actions`` in a record at ``slot`` make, computed without changing anything: ``(tid,
        before, after)`` per action, in order, starting from ``states`` (ids' states after earlier actions of
        the same record) or the replayed state. A begin's transaction is ``(coordinator, slot, its index)``;
        ``taken`` holds the indexes of begins earlier in the record. Raises if an action is not valid, or two
        begins of the record have the same index other than 0 (0 repeats only in records written before
        indexes existed: their begins share the id ``(coordinator, slot)``, as written)."""
        steps: list[tuple[str, TidState | None, TidState]] = []
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

    def _commit(self, steps: list[tuple[str, TidState | None, TidState]], ts: int) -> None:
        """Make the steps of a durable record (replayed or just created) the state: per action, as replay
        does, so a completion folded into a later action keeps its outcome."""
        for tid, before, after in steps:
            self._index(before, after)
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

    def _index(self, before: TidState | None, after: TidState) -> None:
        """Keep ``open_txns`` and ``outcomes`` in step with one transition of one id."""
        still_open = {_open_key(t, after.tid) for t in after.open_txns()}
        if before is not None:
            for txn in before.open_txns():
                if _open_key(txn, before.tid) not in still_open:
                    self.open_txns.pop(_open_key(txn, before.tid), None)
        for key in still_open:
            self.open_txns[key] = after.tid
        for txn, final in _finished(before, after):
            self.outcomes[_key(txn)] = final
            while len(self.outcomes) > RECENT_OUTCOMES:
                self.outcomes.popitem(last=False)

    def _check(self) -> None:
        """Assert the invariants (the randomised model test calls it after every step). Transactions of a
        record written before indexes existed that share an id fail it while both are open: such records are
        replayed, never written."""
        with self._lock:
            opened = [(_open_key(txn, st.tid), st.tid) for st in self.tids.values() for txn in st.open_txns()]
            expected = dict(opened)
            assert len({key[:2] for key in expected}) == len(opened), f"transactions sharing an id: {opened}"
            assert dict(self.open_txns) == expected, (dict(self.open_txns), expected)
            for st in self.tids.values():
                st.check()
                for txn in (st.txn, st.completing.txn if st.completing else None):
                    assert txn is None or (txn.coordinator == self.coordinator and txn.sequence < self.next_slot), st
            assert len(self.outcomes) <= RECENT_OUTCOMES
            assert 0 <= self._snapshot_slot <= max(self.next_slot, 0)

    # --- snapshots ------------------------------------------------------------------------------

    def _snapshot_due(self) -> dict[str, Any] | None:
        """Under the lock: the snapshot to write now (the log grew :data:`SNAPSHOT_EVERY` records past the
        newest one), or None. Claims the slot so one thread of this process writes it."""
        if self._snapshotting or self.next_slot - self._snapshot_slot < SNAPSHOT_EVERY:
            return None
        self._snapshotting = True
        return self._snapshot_value()

    def _snapshot_value(self) -> dict[str, Any]:
        return {
            "coordinator": self.coordinator,
            "next_slot": self.next_slot,
            "low_watermark": self.low_watermark(),
            "tids": [t.to_json() for t in self.tids.values()],
            "outcomes": [[s, v.value, i] if i else [s, v.value] for (s, i), v in self.outcomes.items()],
            "log_time_ms": self.log_time_ms,
            "time_ms": self.clock(),
        }

    def _write_snapshot(self, snap: dict[str, Any]) -> None:
        """Write ``snap`` (taken under the lock) and delete snapshots beyond the newest two. Runs outside
        the lock: a slow store delays no append."""
        prefix = paths.coordinator_snapshots(self.coordinator)
        key = prefix + paths.slot_name(int(snap["next_slot"]))
        if envelope.create_json(self.storage, key, envelope.ObjectKind.COORDINATOR_SNAPSHOT, snap):
            get_logger("txnlog.snapshots").info("coordinator snapshot %s written", key)
        # else another participant wrote the snapshot of the same slot: the same state
        with self._lock:
            self._snapshot_slot = max(self._snapshot_slot, int(snap["next_slot"]))
        names = sorted(n for n in self.storage.list(prefix) if not n.endswith("/"))
        for name in names[:-SNAPSHOTS_KEPT]:
            self.storage.delete(prefix + name)

    def _maintain(self, snap: dict[str, Any]) -> None:
        """Snapshot maintenance after a record landed or was replayed, outside the lock. Whatever fails
        here is logged and never turns a committed append or a read into a reported failure: the next
        participant tries again."""
        try:
            opportunistic(self.storage, "coordinator snapshot", lambda: self._write_snapshot(snap))
        except Exception as exc:
            get_logger("txnlog.snapshots").warning(
                "coordinator %d: snapshot at slot %s not written (%s); the next participant tries again",
                self.coordinator,
                snap["next_slot"],
                exc,
            )
        finally:
            with self._lock:
                self._snapshotting = False

    def snapshot_now(self) -> int:
        """Write a snapshot at the current tail (maintenance); returns its slot."""
        with self._lock:
            self.refresh()
            if self._snapshot_slot == self.next_slot:
                return self.next_slot
            snap = self._snapshot_value()
        self._write_snapshot(snap)
        return int(snap["next_slot"])

    def compact(self, min_age_ms: int = COMPACTION_MIN_AGE_MS) -> int:
        """Delete log slots below the newest snapshot that are older than ``min_age_ms``; returns count."""
        with self._lock:
            self.refresh()
            limit = self._snapshot_slot
        deleted = 0
        names = self.slots.list_slots()
        now = self.clock()
        for slot in names:
            if slot >= limit:
                break
            mtime = self.storage.mtime_ms(self.slots.key(slot))
            if mtime is not None and now - mtime < min_age_ms:
                break
            self.storage.delete(self.slots.key(slot))
            deleted += 1
        return deleted

    # --- queries --------------------------------------------------------------------------------

    def low_watermark(self) -> int:
        """The smallest sequence of a transaction that is not complete (else the next slot)."""
        with self._lock:
            if self.open_txns:
                return int(self.open_txns.keys()[0][0])
            return self.next_slot

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
            final = self.outcomes.get(_key(txn))
            if final is not None:
                return TxnStatus(txn, final)
            return TxnStatus(txn, None)

    def _open_tid(self, txn: TxnId) -> str | None:
        """Under the lock: the transactional id whose open transaction is ``txn``, if any. Of the ids of a
        record written before indexes existed, whose begins share ``txn``, one whose transaction is decided
        comes first (so it is completed after its grace, not held until the other times out), else the first
        by name."""
        seq, index = _key(txn)
        tids = [
            cast(str, self.open_txns[key])
            for key in self.open_txns.irange((seq, index), (seq, index + 1), inclusive=(True, False))
        ]
        if len(tids) > 1:
            decided = [t for t in tids if self.tids[t].prepared(txn) is not None]
            return (decided or tids)[0]
        return tids[0] if tids else None

    def predict_next(self) -> TxnId | None:
        """The id the next record would give a begin appended now, when this view may append without reading
        first and no append of this process is queued or in flight; else None. A guess, read unlocked."""
        if self._queue or not self._current_enough() or not self._lock.acquire(blocking=False):
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
            for key, tid in self.open_txns.items():
                st = self.tids[tid]
                if st.ahead is not None and _key(st.ahead.txn) == key[:2]:
                    out.append(st.activated())
                elif st.txn is not None and _key(st.txn) == key[:2]:
                    out.append(st)
                elif st.completing is not None:
                    view = st.prepared(st.completing.txn)
                    if view is not None:
                        out.append(view)
            return out

    # --- append ---------------------------------------------------------------------------------

    def append(
        self,
        tid: str,
        build: Callable[[TidState | None], Sequence[Action] | None],
        *,
        fallback: Callable[[TidState | None], Sequence[Action] | None] | None = None,
    ) -> TidState | None:
        """Append the actions ``build(current state)`` returns, validated against the latest state.

        ``build`` is called again after every lost race with the then-current state; it may raise (e.g.
        the producer was fenced meanwhile) or return None or nothing (nothing to do any more). Returns the
        id's new state. Snapshot maintenance runs after the record landed and cannot fail the append.

        **Group commit** (Pulsar's buffered transaction-log writer): appends of this process that wait for
        the partition while another is being created go into the next record together, one request for
        all of them (:meth:`_serve`); each one's actions are validated against the state its predecessors in
        the record leave, and each caller gets its own result or error. Each begin of a record gets
        its index among the record's begins (its id is the record's slot and that index), up to
        :data:`MAX_BEGINS_PER_RECORD`: a begin past them waits for the next record, unless the append gives
        a ``fallback``, the actions it takes without its begin (a decision that would begin the next
        transaction ahead goes alone rather than wait); the fallback also serves if the actions with the
        begin are not valid.
        """
        request = _Append(tid, build, fallback)
        with self._queue_lock:
            self._queue.append(request)
        snapshot: dict[str, Any] | None = None
        with self._lock:
            while not request.done:  # a deferred request goes round again (or another thread serves it)
                due = self._serve()
                snapshot = snapshot or due
        if snapshot is not None:
            self._maintain(snapshot)
        if request.error is not None:
            raise request.error
        return cast("TidState | None", request.result)

    def _serve(self) -> dict[str, Any] | None:
        """Under the lock: create one record for every queued append (lost race: replay, rebuild, retry).
        Returns the snapshot due after it, if any."""
        with self._queue_lock:
            batch, self._queue = self._queue, []
        try:
            if not self._current_enough():
                self.refresh()
            while True:
                ts = self.clock()
                actions, steps = self._build(batch, ts)
                if not actions:
                    return None
                record = Record(ts, tuple(actions))
                header, payload = envelope.encode_json(envelope.ObjectKind.COORDINATOR_RECORD, record.to_json())
                try:
                    create_resolving(self.storage, self.slots.key(self.next_slot), [header, payload], header)
                except ObjectExistsError:
                    self.refresh()
                    continue
                self._commit(steps, ts)
                self.next_slot += 1
                self._last_refresh = self._monotonic()  # the slot was free: nothing older was compacted away
                for request in batch:
                    if request.error is None and request.result is _PENDING and not request.deferred:
                        request.result = self.tids.get(request.tid)
                return self._snapshot_due()
        except BaseException as exc:
            for request in batch:
                if request.error is None and request.result is _PENDING and not request.deferred:
                    request.error = exc
            if not isinstance(exc, Exception):
                raise
            return None
        finally:
            later = [request for request in batch if request.deferred]
            for request in batch:
                request.done = not request.deferred
            if later:  # first in line for the next record, served by whichever of their threads comes first
                with self._queue_lock:
                    self._queue[:0] = later

    def _build(self, batch: list[_Append], ts: int) -> tuple[list[Action], list[tuple[str, TidState | None, TidState]]]:
        """The actions of the next record and their steps: each queued append's ``build`` against the state
        the appends before it in the record leave. An append whose build raises, or whose actions are not
        valid, gets that error and contributes nothing; one with nothing to do gets its current state.

        A transaction's id is the slot of its begin record and its index among the record's begins, so a
        record holds at most :data:`MAX_BEGINS_PER_RECORD` begins. An append whose actions would begin more
        is **deferred** (``request.deferred``) to the next record, untouched by this one."""
        actions: list[Action] = []
        steps: list[tuple[str, TidState | None, TidState]] = []
        states: dict[str, TidState | None] = {}
        begins = 0  # so far in the record: the next begin's index
        for request in batch:
            request.result, request.error, request.deferred = _PENDING, None, False
            current = states[request.tid] if request.tid in states else self.tids.get(request.tid)
            try:
                folded = self._build_one(request, current, ts, states, begins)
            except Exception as exc:  # this caller's error (fenced, invalid): the others' actions still go
                request.error = exc
                continue
            if folded is None:
                request.deferred = True
                continue
            wanted, mine = folded
            if not wanted:
                request.result = current
                continue
            begins += sum(isinstance(action, Begin) for action in wanted)
            actions.extend(wanted)
            steps.extend(mine)
            for tid, _, after in mine:
                states[tid] = after
        return actions, steps

    def _build_one(
        self,
        request: _Append,
        current: TidState | None,
        ts: int,
        states: dict[str, TidState | None],
        begins: int,
    ) -> tuple[Sequence[Action], list[tuple[str, TidState | None, TidState]]] | None:
        """One queued append's actions and their steps (none: nothing to do); None: deferred to the next
        record (its begins would pass the record's :data:`MAX_BEGINS_PER_RECORD`). With a fallback, a begin
        that cannot go into this record, or actions that are not valid, give way to the fallback's actions."""
        builds = [request.build] if request.fallback is None else [request.build, request.fallback]
        for i, build in enumerate(builds):
            last = i == len(builds) - 1
            wanted = build(current)
            if not wanted:
                return (), []
            if begins + sum(isinstance(action, Begin) for action in wanted) > MAX_BEGINS_PER_RECORD:
                if last:
                    return None
                continue
            wanted = _numbered(wanted, begins)
            try:
                return wanted, self._fold(wanted, self.next_slot, ts, states, frozenset(range(begins)))
            except TxnLogError:
                if last:
                    raise
        return None  # pragma: no cover - the last build returns or raises


#: A queued append's result before its record is decided.
_PENDING: Any = object()


@dataclass(eq=False)
class _Append:
    """One caller's append waiting for (or served by) a record (:meth:`CoordinatorPartition.append`)."""

    tid: str
    build: Callable[[TidState | None], Sequence[Action] | None]
    #: the actions without a begin, where the caller would rather go without it than wait (see append)
    fallback: Callable[[TidState | None], Sequence[Action] | None] | None = None
    result: Any = _PENDING
    error: BaseException | None = None
    done: bool = False
    #: left for the next record (its begin would share this record's slot with another begin)
    deferred: bool = False


@dataclass
class CoordinatorViews:
    """The coordinator partitions of one log, created lazily (one per process and log)."""

    storage: Storage
    count: int
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
