"""One coordinator partition of the transaction log: records, state, replay (PROTOCOL.md "Transaction log").

The transaction log is split into coordinator partitions by ``crc32(transactional id) % N``. Each one is
a slot log ``_txnlog/coordinators/<05d c>/log/<020d slot>`` of records; a record is a list of actions on
one transactional id, applied atomically in order:

=========  ====================================================================================
action     effect
=========  ====================================================================================
init       new producer id or epoch for the id -> Empty
begin      a transaction starts -> Ongoing; its TxnId is (coordinator, slot of this record)
add        participants (log paths) added to the ongoing transaction -> Ongoing
prepare    the decision, COMMIT or ABORT -> PrepareCommit / PrepareAbort (may bump the epoch: fencing)
complete   every participant has its marker -> CompleteCommit / CompleteAbort, epoch + 1 (KIP-890)
=========  ====================================================================================

A writer computes the next state from the state at slot ``n - 1`` (it has replayed every earlier slot)
with :func:`apply_action`, then creates slot ``n``. If another writer took slot ``n`` it replays it and
recomputes, so every record in the log is a valid transition of the state before it: replay applies
them with the same function (prepare, persist, then change memory).

State is rebuilt from the newest coordinator snapshot plus the slots after it. The low watermark is the
smallest sequence of a transaction that is not complete; everything below it is finished.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from sortedcontainers import SortedDict

from txn_core import envelope, paths
from txn_core.coordinator.states import CoordinatorState, check_coordinator_transition
from txn_core.errors import (
    CorruptDataError,
    InvalidTxnStateError,
    ObjectExistsError,
    ObjectNotFoundError,
    ProducerFencedError,
    StorageError,
    TransactionTimedOutError,
    TxnLogError,
)
from txn_core.ids import TxnId
from txn_core.logs import get_logger
from txn_core.slotlog import SlotLog
from txn_core.storage.base import Storage, create_resolving
from txn_core.storage.guarded import opportunistic

_C = CoordinatorState
#: Completed transactions whose outcome each coordinator keeps for readers (beyond the low watermark).
RECENT_OUTCOMES = 50_000
#: A snapshot is written when the log has grown this many records past the newest one.
SNAPSHOT_EVERY = 500
#: Snapshots kept (older ones are deleted once a newer one exists).
SNAPSHOTS_KEPT = 2
#: Compaction deletes only records older than this; a view idle for half of it re-checks snapshots.
COMPACTION_MIN_AGE_MS = 3600 * 1000


@dataclass(frozen=True, slots=True)
class TidState:
    """The coordinator's record of one transactional id (Kafka's TransactionMetadata)."""

    tid: str
    producer_id: int
    epoch: int
    state: CoordinatorState
    timeout_ms: int
    txn: TxnId | None = None
    start_ms: int = 0
    updated_ms: int = 0
    participants: tuple[str, ...] = ()
    metadata: dict[str, Any] | None = None
    last_committed: dict[str, Any] | None = None
    abort_reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "tid": self.tid,
            "producer_id": self.producer_id,
            "epoch": self.epoch,
            "state": self.state.value,
            "timeout_ms": self.timeout_ms,
            "txn": str(self.txn) if self.txn else None,
            "start_ms": self.start_ms,
            "updated_ms": self.updated_ms,
            "participants": list(self.participants),
            "metadata": self.metadata,
            "last_committed": self.last_committed,
            "abort_reason": self.abort_reason,
        }

    @classmethod
    def from_json(cls, v: dict[str, Any]) -> TidState:
        return cls(
            v["tid"],
            int(v["producer_id"]),
            int(v["epoch"]),
            CoordinatorState(v["state"]),
            int(v["timeout_ms"]),
            TxnId.parse(v["txn"]) if v.get("txn") else None,
            int(v.get("start_ms", 0)),
            int(v.get("updated_ms", 0)),
            tuple(v.get("participants", ())),
            v.get("metadata"),
            v.get("last_committed"),
            v.get("abort_reason"),
        )

    @property
    def deadline_ms(self) -> int:
        return self.start_ms + self.timeout_ms


@dataclass(frozen=True, slots=True)
class TxnStatus:
    """What a reader needs to know about one transaction."""

    txn: TxnId
    #: Ongoing, PrepareCommit, PrepareAbort, CompleteCommit, CompleteAbort; None when only "finished"
    #: is known (below the low watermark, outcome no longer kept: the partition's marker tells).
    state: CoordinatorState | None
    tid: str | None = None
    start_ms: int = 0
    timeout_ms: int = 0
    #: participants of an open transaction (empty when only the final outcome is kept)
    participants: tuple[str, ...] = ()

    @property
    def committed(self) -> bool:
        return self.state in (_C.PREPARE_COMMIT, _C.COMPLETE_COMMIT)

    @property
    def aborted(self) -> bool:
        return self.state in (_C.PREPARE_ABORT, _C.COMPLETE_ABORT)

    @property
    def decided(self) -> bool:
        return self.committed or self.aborted

    @property
    def finished(self) -> bool:
        """Every participant has its marker."""
        return self.state in (_C.COMPLETE_COMMIT, _C.COMPLETE_ABORT) or self.state is None


def apply_action(current: TidState | None, action: dict[str, Any], coordinator: int, slot: int, ts: int) -> TidState:
    """The state after ``action``; raises a named error if the action is not valid now.

    Used by writers (to validate before persisting) and by replay (which wraps errors as corruption).
    """
    kind = action["action"]
    tid = action["tid"]
    if kind == "init":
        check_coordinator_transition(tid, current.state if current else None, _C.EMPTY)
        return TidState(
            tid,
            int(action["producer_id"]),
            int(action["epoch"]),
            _C.EMPTY,
            int(action["timeout_ms"]),
            None,
            0,
            ts,
            (),
            None,
            current.last_committed
            if current and current.producer_id == action["producer_id"]
            else (current.last_committed if current else None),
            None,
        )
    if current is None:
        raise InvalidTxnStateError(f"transactional id {tid!r} has no producer: call init_transactions() first")
    _check_epoch(current, action)
    if kind == "begin":
        check_coordinator_transition(tid, current.state, _C.ONGOING)
        if current.state == _C.ONGOING:
            raise InvalidTxnStateError(
                f"transactional id {tid!r}: transaction {current.txn} is already ongoing; end it before "
                "beginning another"
            )
        return replace(
            current,
            state=_C.ONGOING,
            txn=TxnId(coordinator, slot),
            start_ms=ts,
            updated_ms=ts,
            timeout_ms=int(action.get("timeout_ms", current.timeout_ms)),
            participants=tuple(dict.fromkeys(action.get("participants", ()))),
            metadata=None,
            abort_reason=None,
        )
    _check_txn(current, action)
    if kind == "add":
        check_coordinator_transition(tid, current.state, _C.ONGOING)
        merged = tuple(dict.fromkeys((*current.participants, *action["participants"])))
        return replace(current, participants=merged, updated_ms=ts)
    if kind == "prepare":
        outcome = action["outcome"]
        target = _C.PREPARE_COMMIT if outcome == "COMMIT" else _C.PREPARE_ABORT
        if current.state.is_prepared and current.state != target:
            raise InvalidTxnStateError(
                f"transactional id {tid!r}: transaction {current.txn} is already {current.state.value}"
                + (f" ({current.abort_reason})" if current.abort_reason else "")
                + f"; it cannot move to {target.value}"
            )
        check_coordinator_transition(tid, current.state, target)
        if current.state == target:
            return current
        new_epoch = int(action.get("new_epoch", current.epoch))
        metadata = action.get("metadata")
        return replace(
            current,
            state=target,
            epoch=new_epoch,
            updated_ms=ts,
            metadata=metadata,
            last_committed=metadata if target == _C.PREPARE_COMMIT and metadata is not None else current.last_committed,
            abort_reason=action.get("reason") if target == _C.PREPARE_ABORT else None,
        )
    if kind == "complete":
        target = _C.COMPLETE_COMMIT if current.state == _C.PREPARE_COMMIT else _C.COMPLETE_ABORT
        check_coordinator_transition(tid, current.state, target)
        return replace(current, state=target, epoch=current.epoch + 1, updated_ms=ts)
    raise InvalidTxnStateError(f"unknown transaction log action {kind!r}")


def _check_epoch(current: TidState, action: dict[str, Any]) -> None:
    if "epoch" not in action:
        return
    pid, epoch = int(action.get("producer_id", current.producer_id)), int(action["epoch"])
    if pid != current.producer_id or epoch != current.epoch:
        if (
            current.abort_reason == "timeout"
            and current.txn is not None
            and pid == current.producer_id
            and epoch < current.epoch
        ):
            raise TransactionTimedOutError(
                f"transactional id {current.tid!r}: transaction {current.txn} exceeded its timeout of "
                f"{current.timeout_ms} ms and was aborted by another participant; this producer "
                f"(id {pid}, epoch {epoch}) is fenced. Create a new producer and call init_transactions()."
            )
        raise ProducerFencedError(
            f"transactional id {current.tid!r}: producer id {pid} epoch {epoch} is fenced by producer id "
            f"{current.producer_id} epoch {current.epoch}. Another instance with the same transactional id "
            "called init_transactions(); close this producer."
        )


def _check_txn(current: TidState, action: dict[str, Any]) -> None:
    if "txn" in action and current.txn is not None and str(current.txn) != action["txn"]:
        raise InvalidTxnStateError(
            f"transactional id {current.tid!r}: request for transaction {action['txn']} but the current one "
            f"is {current.txn} ({current.state.value})"
        )


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
    if st.state not in _FINISHED or now - st.updated_ms <= TID_EXPIRATION_MS:
        return False
    kept = st.last_committed
    return kept is None or kept.get(EPHEMERAL_KEY) is True


class CoordinatorPartition:
    """Replayed state of one coordinator partition; appends validated records. Thread-safe."""

    def __init__(self, storage: Storage, coordinator: int, clock: Callable[[], int]) -> None:
        self.storage = storage
        self.coordinator = coordinator
        self.slots = SlotLog(storage, paths.coordinator_log(coordinator))
        self.clock = clock
        self._lock = threading.RLock()
        self.next_slot = -1  # -1: not loaded yet
        self.tids: dict[str, TidState] = {}
        self.open_txns: SortedDict = SortedDict()  # sequence -> tid, transactions not complete
        self.outcomes: OrderedDict[int, CoordinatorState] = OrderedDict()  # sequence -> final state
        self._snapshot_slot = 0
        self._last_refresh = time.monotonic()
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
            if st.txn is not None and not st.state.is_complete:
                self.open_txns[st.txn.sequence] = st.tid
        self.outcomes = OrderedDict((int(s), CoordinatorState(v)) for s, v in snap["outcomes"])
        self.log_time_ms = int(snap.get("log_time_ms", max((t.updated_ms for t in self.tids.values()), default=0)))

    def refresh(self) -> None:
        """Apply every record written since the last refresh (one GET per new slot, plus one miss)."""
        with self._lock:
            if self.next_slot < 0:
                self._load()
            while True:
                try:
                    data = self.slots.read(self.next_slot)
                except ObjectNotFoundError:
                    if self._compacted_past_us():
                        self._load()
                        continue
                    break
                self._apply_record(self.next_slot, data)
                self.next_slot += 1
            if self.next_slot - self._snapshot_slot >= SNAPSHOT_EVERY:
                opportunistic(self.storage, "coordinator snapshot", self._write_snapshot)

    def _current_enough(self) -> bool:
        """Whether an append may create at ``next_slot`` without first reading it (PROTOCOL.md "Transaction
        log", appends): the view is loaded and learned within half the compaction age that ``next_slot``
        was free. Then a record another writer put there since is younger than the compaction age, so
        it still exists and the create itself reports the conflict (and the append replays and retries);
        a slot reused after compaction cannot happen."""
        return self.next_slot >= 0 and time.monotonic() - self._last_refresh < COMPACTION_MIN_AGE_MS / 2000

    def _compacted_past_us(self) -> bool:
        """Whether compaction deleted slots this view has not applied yet (only possible when the view
        was idle for longer than half the compaction age; see PROTOCOL.md "Compaction")."""
        now = time.monotonic()
        idle, self._last_refresh = now - self._last_refresh, now
        if idle < COMPACTION_MIN_AGE_MS / 2000:
            return False
        names = self.storage.list(paths.coordinator_snapshots(self.coordinator))
        newest = max((int(n) for n in names if n.isdigit()), default=0)
        return newest > self.next_slot

    def _apply_record(self, slot: int, data: bytes) -> None:
        key = self.slots.key(slot)
        record = envelope.decode(data, key, envelope.ObjectKind.COORDINATOR_RECORD).json(key)
        try:
            self._apply_actions(slot, record)
        except TxnLogError as exc:
            raise CorruptDataError(f"{key}: record is not a valid transition: {exc}", key) from exc

    def _apply_actions(self, slot: int, record: dict[str, Any]) -> None:
        ts = int(record["ts"])
        for action in record["actions"]:
            tid = action["tid"]
            before = self.tids.get(tid)
            after = apply_action(before, action, self.coordinator, slot, ts)
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
        if before is not None and before.txn is not None and before.txn != after.txn:
            self.open_txns.pop(before.txn.sequence, None)
        if after.txn is None:
            return
        seq = after.txn.sequence
        if after.state.is_complete:
            if self.open_txns.pop(seq, None) is not None or seq not in self.outcomes:
                self.outcomes[seq] = after.state
                while len(self.outcomes) > RECENT_OUTCOMES:
                    self.outcomes.popitem(last=False)
        else:
            self.open_txns[seq] = after.tid

    # --- snapshots ------------------------------------------------------------------------------

    def _write_snapshot(self) -> None:
        snap = {
            "coordinator": self.coordinator,
            "next_slot": self.next_slot,
            "low_watermark": self.low_watermark(),
            "tids": [t.to_json() for t in self.tids.values()],
            "outcomes": [[s, v.value] for s, v in self.outcomes.items()],
            "log_time_ms": self.log_time_ms,
            "time_ms": self.clock(),
        }
        prefix = paths.coordinator_snapshots(self.coordinator)
        key = prefix + paths.slot_name(self.next_slot)
        envelope.create_json(self.storage, key, envelope.ObjectKind.COORDINATOR_SNAPSHOT, snap)
        get_logger("txnlog.snapshots").info("coordinator snapshot %s written", key)
        self._snapshot_slot = self.next_slot
        names = sorted(n for n in self.storage.list(prefix) if not n.endswith("/"))
        for name in names[:-SNAPSHOTS_KEPT]:
            self.storage.delete(prefix + name)

    def _snapshot_after_append(self) -> None:
        """Snapshot maintenance after a record landed: it never turns the committed append into a failure."""
        try:
            self._write_snapshot()
        except StorageError as exc:
            get_logger("txnlog.snapshots").warning(
                "coordinator %d: snapshot at slot %d not written (%s); the next writer tries again",
                self.coordinator,
                self.next_slot,
                exc,
            )

    def snapshot_now(self) -> int:
        """Write a snapshot at the current tail (maintenance); returns its slot."""
        with self._lock:
            self.refresh()
            if self._snapshot_slot != self.next_slot:
                self._write_snapshot()
            return self.next_slot

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
                return int(self.open_txns.keys()[0])
            return self.next_slot

    def state(self, tid: str) -> TidState | None:
        with self._lock:
            return self.tids.get(tid)

    def status(self, txn: TxnId) -> TxnStatus | None:
        """The status of ``txn`` as of the last refresh; None if this view has not seen it yet."""
        with self._lock:
            seq = txn.sequence
            if seq >= self.next_slot:
                return None
            tid = self.open_txns.get(seq)
            if tid is not None:
                st = self.tids[tid]
                return TxnStatus(txn, st.state, tid, st.start_ms, st.timeout_ms, st.participants)
            final = self.outcomes.get(seq)
            if final is not None:
                return TxnStatus(txn, final)
            return TxnStatus(txn, None)

    def open_states(self) -> list[TidState]:
        with self._lock:
            return [self.tids[t] for t in self.open_txns.values()]

    # --- append ---------------------------------------------------------------------------------

    def append(self, tid: str, build: Callable[[TidState | None], Iterable[dict[str, Any]] | None]) -> TidState | None:
        """Append the actions ``build(current state)`` returns, validated against the latest state.

        ``build`` is called again after every lost race with the then-current state; it may raise (e.g.
        the producer was fenced meanwhile) or return None (nothing to do any more). Returns the new state.
        """
        with self._lock:
            if not self._current_enough():
                self.refresh()
            while True:
                current = self.tids.get(tid)
                actions = build(current)
                if actions is None:
                    return current
                actions = list(actions)
                if not actions:
                    return current
                ts = self.clock()
                after = current
                steps: list[tuple[TidState | None, TidState]] = []
                for action in actions:
                    before, after = after, apply_action(after, action, self.coordinator, self.next_slot, ts)
                    steps.append((before, after))
                record = {"ts": ts, "actions": actions}
                header, payload = envelope.encode_json(envelope.ObjectKind.COORDINATOR_RECORD, record)
                try:
                    create_resolving(self.storage, self.slots.key(self.next_slot), [header, payload], header)
                except ObjectExistsError:
                    self.refresh()
                    continue
                if after is None:  # unreachable: at least one action was applied
                    raise InvalidTxnStateError(f"transactional id {tid!r}: no state after {actions}")
                for before, step in steps:  # per action, as replay does: a folded complete keeps its outcome
                    self._index(before, step)
                self.tids[tid] = after
                self._advance_time(ts)
                self.next_slot += 1
                self._last_refresh = time.monotonic()  # the slot was free: nothing older was compacted away
                if self.next_slot - self._snapshot_slot >= SNAPSHOT_EVERY:
                    self._snapshot_after_append()
                return after


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class CoordinatorViews:
    """The coordinator partitions of one log, created lazily (one per process and log)."""

    storage: Storage
    count: int
    clock: Callable[[], int] = wall_clock_ms
    _views: dict[int, CoordinatorPartition] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, coordinator: int) -> CoordinatorPartition:
        with self._lock:
            view = self._views.get(coordinator)
            if view is None:
                view = CoordinatorPartition(self.storage, coordinator, self.clock)
                self._views[coordinator] = view
            return view
