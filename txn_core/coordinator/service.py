"""Coordinator operations run by any participant (PROTOCOL.md "Transactions" and "Recovery").

There is no coordinator process: every producer, consumer and admin call runs these functions against
the transaction log. The two-phase end of a transaction is:

1. persist ``prepare`` (PrepareCommit / PrepareAbort): the decision. From here on the outcome is fixed;
   read_committed readers that meet the transaction's data treat it as decided.
2. write a COMMIT / ABORT marker entry into every participant log (in parallel). Idempotent: a
   participant that already has a marker for the transaction ignores later ones.
3. persist ``complete`` (CompleteCommit / CompleteAbort), bumping the epoch (KIP-890).

Crash windows: before (1) the transaction is Ongoing and is aborted by whoever meets it after its
timeout, or by the next ``init_transactions`` of its transactional id. Between (1) and (3) anyone who
finds it prepared for longer than the completion grace (or the next ``init_transactions``) repeats (2)
and (3). After (3) nothing remains to do.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from txn_core.coordinator.states import CoordinatorState
from txn_core.coordinator.txnlog import CoordinatorPartition, CoordinatorViews, TidState, TxnStatus
from txn_core.entry import EntryKind, crc32, encode_json
from txn_core.errors import (
    InvalidTxnStateError,
    ProducerFencedError,
    StoragePermissionError,
    TransactionTimedOutError,
)
from txn_core.ids import TxnId, validate_name
from txn_core.logs import get_logger
from txn_core.partition import PartitionLog
from txn_core.pidalloc import allocate_producer_id
from txn_core.storage.base import Storage

_C = CoordinatorState
MAX_EPOCH = 2**31 - 16
#: How long a transaction may stay prepared before another participant completes it (ms).
MIN_COMPLETION_GRACE_MS = 5_000
MAX_TIMEOUT_MS = 15 * 60 * 1000

logger = get_logger("txnlog.coordinator")


def coordinator_for(tid: str, partitions: int) -> int:
    """The coordinator partition of a transactional id: ``crc32(utf-8) % partitions``."""
    return zlib.crc32(tid.encode()) % partitions


class TransactionCoordinator:
    """Coordinator operations over one log's transaction log."""

    def __init__(
        self,
        storage: Storage,
        views: CoordinatorViews,
        logs: Callable[[str], PartitionLog],
        partitions: int,
        clock: Callable[[], int],
    ) -> None:
        self.storage = storage
        self.views = views
        self.logs = logs
        self.partitions = partitions
        self.clock = clock

    def view_for(self, tid: str) -> CoordinatorPartition:
        return self.views.get(coordinator_for(tid, self.partitions))

    def state(self, tid: str, *, refresh: bool = True) -> TidState | None:
        view = self.view_for(tid)
        if refresh:
            view.refresh()
        return view.state(tid)

    # --- producer lifecycle -------------------------------------------------------------------

    def init_producer(self, tid: str, timeout_ms: int) -> TidState:
        """Fence older instances of ``tid`` and finish what they left (Kafka's InitProducerId).

        An ongoing transaction is aborted (its epoch bumped first, so its producer is fenced); a
        prepared one is completed. Then the epoch is bumped once more for the new instance.
        """
        validate_name("transactional id", tid)
        if not 1 <= timeout_ms <= MAX_TIMEOUT_MS:
            raise InvalidTxnStateError(f"transaction_timeout_ms must be in [1, {MAX_TIMEOUT_MS}], got {timeout_ms}")
        view = self.view_for(tid)
        while True:
            view.refresh()
            current = view.state(tid)
            if current is not None and current.state == _C.ONGOING:
                self._prepare_abort(view, current, reason="fenced by a new producer instance")
                continue
            if current is not None and current.state.is_prepared:
                self.complete(current)
                continue
            break

        def build(cur: TidState | None) -> list[dict[str, Any]] | None:
            if cur is not None and not cur.state.is_complete:
                raise _RetryError
            if cur is None or cur.epoch >= MAX_EPOCH:
                pid, epoch = allocate_producer_id(self.storage), 0
            else:
                pid, epoch = cur.producer_id, cur.epoch + 1
            return [{"action": "init", "tid": tid, "producer_id": pid, "epoch": epoch, "timeout_ms": timeout_ms}]

        try:
            state = view.append(tid, build)
        except _RetryError:
            return self.init_producer(tid, timeout_ms)
        if state is None:  # pragma: no cover - build always returns actions or raises
            raise InvalidTxnStateError(f"transactional id {tid!r}: init produced no state")
        logger.info("init %s: producer id %d epoch %d (older instances fenced)", tid, state.producer_id, state.epoch)
        return state

    def begin(self, tid: str, producer_id: int, epoch: int, timeout_ms: int, participants: Iterable[str]) -> TidState:
        """Persist the start of a transaction with its first participants; returns the Ongoing state."""
        view = self.view_for(tid)
        parts = list(participants)
        state = view.append(
            tid,
            lambda cur: [
                {
                    "action": "begin",
                    "tid": tid,
                    "producer_id": producer_id,
                    "epoch": epoch,
                    "timeout_ms": timeout_ms,
                    "participants": parts,
                }
            ],
        )
        if state is None or state.txn is None:  # pragma: no cover
            raise InvalidTxnStateError(f"transactional id {tid!r}: begin produced no transaction")
        return state

    def add(self, tid: str, producer_id: int, epoch: int, txn: TxnId, participants: Iterable[str]) -> TidState:
        """Register participants before the first write to each (idempotent)."""
        view = self.view_for(tid)
        parts = list(participants)

        def build(cur: TidState | None) -> list[dict[str, Any]] | None:
            if (
                cur is not None
                and cur.txn == txn
                and cur.state == _C.ONGOING
                and cur.producer_id == producer_id
                and cur.epoch == epoch
                and all(p in cur.participants for p in parts)
            ):
                return None
            return [
                {
                    "action": "add",
                    "tid": tid,
                    "producer_id": producer_id,
                    "epoch": epoch,
                    "txn": str(txn),
                    "participants": parts,
                }
            ]

        state = view.append(tid, build)
        if state is None:  # pragma: no cover
            raise InvalidTxnStateError(f"transactional id {tid!r}: no state")
        return state

    def end(
        self,
        tid: str,
        producer_id: int,
        epoch: int,
        txn: TxnId,
        commit: bool,
        metadata: dict[str, Any] | None = None,
        *,
        complete: bool = True,
    ) -> TidState:
        """Decide and finish ``txn``: persist Prepare*, write markers, persist Complete*.

        A retried end of the same transaction with the same decision continues where the first stopped.
        With ``complete=False`` returns right after the decision is durable (markers not yet written).
        """
        view = self.view_for(tid)
        outcome = "COMMIT" if commit else "ABORT"

        def build(cur: TidState | None) -> list[dict[str, Any]] | None:
            if (
                cur is not None
                and cur.txn == txn
                and cur.state in (_C.PREPARE_COMMIT, _C.COMPLETE_COMMIT, _C.PREPARE_ABORT, _C.COMPLETE_ABORT)
            ):
                decided_commit = cur.state in (_C.PREPARE_COMMIT, _C.COMPLETE_COMMIT)
                if decided_commit != commit and cur.abort_reason == "timeout":
                    raise TransactionTimedOutError(
                        f"transactional id {tid!r}: transaction {txn} exceeded its timeout of {cur.timeout_ms} ms "
                        "and was aborted by another participant; nothing of it is visible. This producer is "
                        "fenced: create a new one and call init_transactions(), then redo the work."
                    )
                if decided_commit != commit and cur.abort_reason is not None and cur.epoch != epoch:
                    raise ProducerFencedError(
                        f"transactional id {tid!r}: transaction {txn} was aborted ({cur.abort_reason}); producer "
                        f"id {producer_id} epoch {epoch} is fenced. Close this producer."
                    )
                if decided_commit != commit:
                    raise InvalidTxnStateError(
                        f"transactional id {tid!r}: transaction {txn} was already "
                        f"{'committed' if decided_commit else 'aborted'}"
                        + (f" ({cur.abort_reason})" if cur.abort_reason else "")
                        + f"; it cannot be {'committed' if commit else 'aborted'}"
                    )
                if cur.epoch not in (epoch, epoch + 1) or cur.producer_id != producer_id:
                    raise ProducerFencedError(
                        f"transactional id {tid!r}: producer id {producer_id} epoch {epoch} is fenced"
                    )
                return None
            action: dict[str, Any] = {
                "action": "prepare",
                "tid": tid,
                "producer_id": producer_id,
                "epoch": epoch,
                "txn": str(txn),
                "outcome": outcome,
            }
            if metadata is not None:
                action["metadata"] = metadata
            return [action]

        state = view.append(tid, build)
        if state is None:  # pragma: no cover
            raise InvalidTxnStateError(f"transactional id {tid!r}: no state")
        logger.info("%s %s: transaction %s decided %s", outcome.lower(), tid, txn, state.state.name)
        if state.state.is_prepared and complete:
            state = self.complete(state)
        return state

    # --- second phase -------------------------------------------------------------------------

    def complete(self, prepared: TidState, *, markers_written: bool = False) -> TidState:
        """Write the markers of a prepared transaction and persist Complete* (idempotent)."""
        if prepared.txn is None:  # pragma: no cover
            raise InvalidTxnStateError(f"transactional id {prepared.tid!r}: nothing to complete")
        if not markers_written:
            self.write_markers(prepared)
        view = self.view_for(prepared.tid)
        txn = prepared.txn

        def build(cur: TidState | None) -> list[dict[str, Any]] | None:
            if cur is None or cur.txn != txn or not cur.state.is_prepared:
                return None  # someone else completed it
            return [{"action": "complete", "tid": prepared.tid, "txn": str(txn)}]

        state = view.append(prepared.tid, build)
        if state is None:  # pragma: no cover
            raise InvalidTxnStateError(f"transactional id {prepared.tid!r}: no state")
        return state

    def complete_and_begin(self, prepared: TidState, timeout_ms: int, participants: Iterable[str]) -> TidState:
        """One record: Complete* of ``prepared`` (whose markers MUST all be written) and ``begin`` of the
        same producer's next transaction, at the epoch the completion bumps to. Saves a storage round trip
        per transaction; if someone else completed ``prepared`` meanwhile, only ``begin`` is written. A
        fencing instance makes the ``begin`` fail validation (ProducerFencedError)."""
        if prepared.txn is None:  # pragma: no cover
            raise InvalidTxnStateError(f"transactional id {prepared.tid!r}: nothing to complete")
        view = self.view_for(prepared.tid)
        txn, tid, parts = prepared.txn, prepared.tid, list(participants)
        begin = {
            "action": "begin",
            "tid": tid,
            "producer_id": prepared.producer_id,
            "epoch": prepared.epoch + 1,
            "timeout_ms": timeout_ms,
            "participants": parts,
        }

        def build(cur: TidState | None) -> list[dict[str, Any]] | None:
            if cur is not None and cur.txn == txn and cur.state.is_prepared:
                return [{"action": "complete", "tid": tid, "txn": str(txn)}, begin]
            return [begin]

        state = view.append(tid, build)
        if state is None or state.txn is None:  # pragma: no cover
            raise InvalidTxnStateError(f"transactional id {tid!r}: begin produced no transaction")
        return state

    def write_markers(self, prepared: TidState) -> None:
        """One COMMIT or ABORT marker entry per participant log, written in parallel."""
        if prepared.txn is None:  # pragma: no cover
            return
        kind = EntryKind.COMMIT if prepared.state == _C.PREPARE_COMMIT else EntryKind.ABORT
        payload = encode_json({"outcome": kind.name, "txn": str(prepared.txn), "tid": prepared.tid})
        txn, pid, epoch = prepared.txn, prepared.producer_id, prepared.epoch

        def one(path: str) -> None:
            self.logs(path).append(
                kind, payload, len(payload), crc32(payload), 1, producer_id=pid, producer_epoch=epoch, txn=txn
            )

        parts = list(prepared.participants)
        if len(parts) <= 1:
            for p in parts:
                one(p)
            return
        with ThreadPoolExecutor(max_workers=min(8, len(parts))) as pool:
            for f in [pool.submit(one, p) for p in parts]:
                f.result()

    # --- timeouts, recovery, admin ------------------------------------------------------------

    def _prepare_abort(self, view: CoordinatorPartition, current: TidState, reason: str) -> TidState | None:
        txn = current.txn

        def build(cur: TidState | None) -> list[dict[str, Any]] | None:
            if cur is None or cur.txn != txn or cur.state != _C.ONGOING:
                return None
            return [
                {
                    "action": "prepare",
                    "tid": cur.tid,
                    "producer_id": cur.producer_id,
                    "epoch": cur.epoch,
                    "txn": str(txn),
                    "outcome": "ABORT",
                    "new_epoch": cur.epoch + 1,
                    "reason": reason,
                }
            ]

        state = view.append(current.tid, build)
        if state is not None and state.state.is_prepared and state.txn == txn:
            logger.info(
                "abort %s: transaction %s aborted (%s); epoch %d fenced", current.tid, txn, reason, current.epoch
            )
            return self.complete(state)
        return state

    def abort_transaction(self, tid: str, reason: str = "aborted by an operator") -> TidState | None:
        """An operator's abort of ``tid``'s ongoing transaction (fences its producer); completes a prepared one."""
        view = self.view_for(tid)
        view.refresh()
        current = view.state(tid)
        if current is None:
            return None
        if current.state == _C.ONGOING:
            return self._prepare_abort(view, current, reason)
        if current.state.is_prepared:
            return self.complete(current)
        return current

    def expire(self, view: CoordinatorPartition, now: int | None = None) -> list[TidState]:
        """Abort every transaction of ``view`` past its timeout; complete those prepared too long."""
        now = self.clock() if now is None else now
        done = []
        for st in view.open_states():
            if st.state == _C.ONGOING and now > st.deadline_ms:
                result = self._prepare_abort(view, st, reason="timeout")
                if result is not None:
                    done.append(result)
            elif st.state.is_prepared and now - st.updated_ms > max(MIN_COMPLETION_GRACE_MS, st.timeout_ms):
                done.append(self.complete(st))
        return done

    def resolve(self, txn: TxnId) -> TxnStatus:
        """The status of ``txn`` for a reader, refreshing the coordinator view and enforcing its timeout."""
        view = self.views.get(txn.coordinator)
        status = view.status(txn)
        if status is None or status.state in (_C.ONGOING,) or (status.state is not None and status.state.is_prepared):
            view.refresh()
            status = view.status(txn)
        if status is None:
            # The begin record is always durable before any data of the transaction; a transaction id
            # the coordinator never issued is not a transaction anyone will end: treat it as finished.
            return TxnStatus(txn, None)
        if status.state == _C.ONGOING and status.tid is not None and self.clock() > status.start_ms + status.timeout_ms:
            st = view.state(status.tid)
            if st is not None and st.txn == txn and not getattr(self.storage, "read_only", False):
                try:
                    self._prepare_abort(view, st, reason="timeout")
                except StoragePermissionError:  # a read-only reader cannot abort it: it waits for a writer
                    self.storage.read_only = True  # type: ignore[attr-defined]
            status = view.status(txn) or TxnStatus(txn, None)
        elif status.state is not None and status.state.is_prepared and status.tid is not None:
            st = view.state(status.tid)
            if (
                st is not None
                and st.txn == txn
                and not getattr(self.storage, "read_only", False)
                and self.clock() - st.updated_ms > max(MIN_COMPLETION_GRACE_MS, st.timeout_ms)
            ):
                try:
                    self.complete(st)
                except StoragePermissionError:  # decided already: readers treat it as such anyway
                    self.storage.read_only = True  # type: ignore[attr-defined]
        return status


class _RetryError(Exception):
    pass
