"""A subscription's ack log: append, replay, verdicts, pending-transaction resolution (PROTOCOL.md
"Subscriptions", "Replay").

The ack log is an ordinary partition log (``subscriptions/<topic>/<05d p>/<name>/acks``). Plain
acknowledgements are non-transactional DATA entries; transactional ones are DATA entries carrying the
transaction id, appended by the transaction's producer after registering the ack log as a participant,
so the coordinator's two-phase end writes the COMMIT / ABORT marker here like in any partition.

:class:`AckLog` keeps a :class:`SubscriptionState` replica current: it loads the newest snapshot and
applies every entry after it, in slot order (one GET per new entry; one GET that misses when nothing is
new). Every ack record gets a :class:`Verdict` at its position. A writer learns whether its own record
won by replaying up to it (:meth:`AckLog.verdict`): all replicas agree, because the verdict depends only
on the log prefix before the record.

Crash windows: an append is one create-if-absent (complete or absent; an unknown outcome is resolved by
reading back). A writer that dies after appending and before learning the verdict leaves a record that
every replica judges the same way; a transactional one is then ended by its transaction's timeout or the
next ``init_transactions`` of its producer, like any participant.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

from txn_core.clients.subscriptions.records import AckOp, AckRecord
from txn_core.clients.subscriptions.state import SubscriptionState, Verdict
from txn_core.clients.subscriptions.store import SnapshotRef, SnapshotStore, SubscriptionMeta
from txn_core.clock import monotonic
from txn_core.errors import CorruptDataError, ObjectNotFoundError, TransactionConflictError, UnknownOutcomeError
from txn_core.format import paths
from txn_core.format.entry import EntryKind, Payload
from txn_core.partition.partition import AppendResult

if TYPE_CHECKING:
    from txn_core.clients.context import SupportsContext

#: Verdicts kept for writers that have not looked theirs up yet.
VERDICTS_KEPT = 4096
#: A snapshot is written after this many entries since the last one...
SNAPSHOT_EVERY_ENTRIES = 256
#: ...or after this long (log clock) if anything changed.
SNAPSHOT_EVERY_MS = 10_000
#: Open transactions holding acknowledgements are checked with the coordinator at most this often.
RESOLVE_EVERY_S = 1.0


class AckLog:
    """One replica of a subscription's state over its ack log (see module doc). Thread-safe."""

    def __init__(self, log: SupportsContext, meta: SubscriptionMeta) -> None:
        self.ctx = ctx = log.context
        self.meta = meta
        self.ref = meta.ref
        self.path = meta.ref.ack_log_path
        self.plog = ctx.partition_log(self.path)
        self.snapshots = SnapshotStore(ctx.storage, meta.ref)
        self._monotonic = monotonic(ctx.clock)
        self._state: SubscriptionState | None = None
        self.verdicts: OrderedDict[int, Verdict] = OrderedDict()
        self.last_snapshot = SnapshotRef(-1, 0)
        self._last_resolve = 0.0
        self._lock = threading.RLock()

    # --- replay ---------------------------------------------------------------------------------

    @property
    def state(self) -> SubscriptionState:
        with self._lock:
            if self._state is None:
                self._state = self._load()
            return self._state

    def _load(self) -> SubscriptionState:
        start = self.plog.log_start(refresh=True)
        state = self.snapshots.load_latest(start.slot)
        if state is None:
            if start.slot > 0:
                raise CorruptDataError(
                    f"{self.ref}: the ack log was trimmed to slot {start.slot} but no readable snapshot at or "
                    "above it exists; restore the snapshot objects under "
                    f"{self.ref.snapshots}",
                    self.ref.snapshots,
                )
            state = SubscriptionState(self.meta.initial_offset, slot=start.slot, position=start.offset)
            self.last_snapshot = SnapshotRef(-1, self.ctx.clock())
        else:
            self.last_snapshot = SnapshotRef(state.slot, self.ctx.clock())
        return state

    def refresh(self, *, until_slot: int | None = None, resolve: bool = False) -> SubscriptionState:
        """Apply every entry after the state's position (up to slot ``until_slot`` exclusive).

        With ``resolve``, open transactions holding acknowledgements are first checked with the
        coordinator (at most every :data:`RESOLVE_EVERY_S`): one past its timeout is aborted on the spot,
        one prepared for too long is completed — so a dead consumer's pending acks are released.
        """
        with self._lock:
            state = self._replay(until_slot)
            if resolve and state.txns and self._monotonic() - self._last_resolve >= RESOLVE_EVERY_S:
                self.resolve_pending()
                state = self.state
            return state

    def _replay(self, until_slot: int | None) -> SubscriptionState:
        with self._lock:
            state = self.state
            while until_slot is None or state.slot < until_slot:
                try:
                    entry = self.plog.read_entry(state.slot)
                except ObjectNotFoundError:
                    if self.plog.deleted(state.slot, max_staleness_s=0.0 if until_slot is not None else 5.0):
                        # Trimmed past this replica: continue from the snapshot the trim kept.
                        state = self._state = self._load()
                        continue
                    break
                header = entry.header
                record = AckRecord.decode(entry.payload(), entry.key) if header.kind == EntryKind.DATA else None
                verdict = state.apply(entry.slot, header, record, entry.key)
                if verdict is not None:
                    self.verdicts[verdict.slot] = verdict
                    while len(self.verdicts) > VERDICTS_KEPT:
                        self.verdicts.popitem(last=False)
            return state

    def resolve_pending(self) -> None:
        """Ask the coordinator about every open transaction holding acknowledgements (enforcing timeouts
        and completing stuck ones: their markers land in this log), then catch up.

        A transaction the coordinator reports finished but still open here wrote acknowledgements after
        its marker, which the ended cache (:data:`~.state.ENDED_KEPT` outcomes) no longer remembers: a
        zombie. Its status was read before the replay to the end, so its marker was already durable and is
        behind those acknowledgements. An ABORT marker for it is appended (a repeated marker changes nothing
        for replicas that remember the first), so every replica drops the zombie's acknowledgements at the
        same position of the log: the state stays a function of the log alone.
        """
        with self._lock:
            self._last_resolve = self._monotonic()
            held = {t: pt.first_slot for t, pt in self.state.txns.items()}
            statuses = {
                t: self.ctx.coordinator.resolve(t, functools.partial(self._written_at, slot))
                for t, slot in held.items()
            }
            state = self._replay(None)
            for t, status in statuses.items():
                if t in state.txns and status.finished:
                    payload = Payload.of_json(
                        {
                            "outcome": "ABORT",
                            "txn": str(t),
                            "reason": "acknowledgements written after the transaction's marker",
                        }
                    )
                    self.plog.append_payload(EntryKind.ABORT, payload, 1, txn=t)
            self._replay(None)

    def _written_at(self, slot: int) -> int | None:
        """The timestamp of the ack entry at ``slot`` (a transaction's first here: where the timeout of one
        begun ahead runs from); None if retention or trimming removed it meanwhile."""
        try:
            return self.plog.read_header(slot).timestamp_ms
        except ObjectNotFoundError:
            return None

    # --- writing --------------------------------------------------------------------------------

    def append(self, record: AckRecord) -> AppendResult:
        """Append a non-transactional ack record (one entry)."""
        return self.plog.append_payload(EntryKind.DATA, Payload.of(record.encode()), 1)

    def give_up_lost(self, by: str) -> int:
        """Append a ``lost`` record moving the mark-delete position to the topic partition's log start, if
        retention removed offsets above it; returns how far the mark-delete position moved (0: nothing was
        lost): to the log start, and on over what was acknowledged right above it. The log start only
        grows, so the record never gives up an offset that can still be read."""
        state = self.refresh(resolve=True)
        topic = self.ctx.partition_log(paths.partition_log_path(self.ref.topic, self.ref.partition))
        upto = topic.log_start(refresh=True).offset
        behind = state.mark_delete
        if upto <= behind:
            return 0
        self.append(AckRecord(AckOp.LOST, (), upto, (), by))
        return self.refresh().mark_delete - behind

    def verdict(self, slot: int) -> Verdict:
        """The verdict of the ack record at ``slot`` (replaying up to it)."""
        with self._lock:
            state = self.refresh(until_slot=slot + 1)
            verdict = self.verdicts.get(slot)
            if verdict is not None:
                return verdict
            if state.slot <= slot:
                raise UnknownOutcomeError(f"{self.ref}: ack record at slot {slot} is not readable yet")
            raise UnknownOutcomeError(
                f"{self.ref}: the ack log was trimmed past slot {slot} before its acknowledgement could be "
                "verified; treat it as failed (abort the transaction, or acknowledge again)"
            )

    @staticmethod
    def raise_if_void(verdict: Verdict, ref: object, offsets: list[int]) -> None:
        """Raise :class:`TransactionConflictError` for a record that lost."""
        if verdict.accepted:
            return
        shown = ", ".join(str(c) for c in verdict.conflicts[:10])
        more = f" and {len(verdict.conflicts) - 10} more" if len(verdict.conflicts) > 10 else ""
        who = f"transaction {verdict.txn}" if verdict.txn else "a plain acknowledgement"
        raise TransactionConflictError(
            f"{ref}: the acknowledgement of offsets {_short(offsets)} by {who} (ack-log slot {verdict.slot}) "
            f"was refused: {verdict.reason}" + (f": {shown}{more}" if shown else "") + ". The first "
            "acknowledgement in ack-log order wins; this one had no effect. "
            + (
                "Abort the transaction: its output must not be committed."
                if verdict.txn
                else "Those records are held or done by someone else."
            )
        )

    # --- snapshots ------------------------------------------------------------------------------

    def snapshot_due(self, now_ms: int) -> bool:
        state = self.state
        last = self.last_snapshot
        if state.slot <= last.slot:
            return False
        return state.slot - max(last.slot, 0) >= SNAPSHOT_EVERY_ENTRIES or now_ms - last.time_ms >= SNAPSHOT_EVERY_MS

    def write_snapshot(self, now_ms: int) -> SnapshotRef:
        with self._lock:
            self.last_snapshot = self.snapshots.write(self.state, now_ms)
            return self.last_snapshot


def _short(offsets: list[int]) -> str:
    if len(offsets) <= 8:
        return str(offsets)
    return f"[{offsets[0]}, {offsets[1]}, ..., {offsets[-1]}] ({len(offsets)} offsets)"
