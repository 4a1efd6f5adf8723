"""Coordinator operations run by any participant (PROTOCOL.md "Transactions" and "Recovery").

There is no coordinator process: every producer, consumer and admin call runs these functions against
the transaction log. The two-phase end of a transaction is:

1. persist ``prepare`` (PrepareCommit / PrepareAbort): the decision. From here on the outcome is fixed;
   read_committed readers that meet the transaction's data treat it as decided.
2. write a COMMIT / ABORT marker entry into every participant log (in parallel). Idempotent: a
   participant that already has a marker for the transaction ignores later ones.
3. persist ``complete`` (CompleteCommit / CompleteAbort), bumping the epoch (KIP-890).

A producer folds step 3 into its next record (``completed=`` of :meth:`TransactionCoordinator.begin`,
:meth:`~TransactionCoordinator.add` and :meth:`~TransactionCoordinator.end`) once the markers are durable,
and its next ``begin`` does not wait for them: begun while the previous transaction is still Prepare*, it
makes that transaction the id's *completing* one, completed by a later record.

Crash windows: before (1) the transaction is Ongoing and is aborted by whoever meets it after its
timeout, or by the next ``init_transactions`` of its transactional id. Between (1) and (3) anyone who
finds it prepared for longer than the completion grace (or the next ``init_transactions``) repeats (2)
and (3), for the completing transaction as for the current one. After (3) nothing remains to do.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Collection, Iterable, Sequence

from txn_core.clock import Clock
from txn_core.coordinator.actions import Action, Add, Begin, Complete, Init, Outcome, Prepare, Withdraw
from txn_core.coordinator.pidalloc import allocate_producer_id
from txn_core.coordinator.txnlog import TID_EXPIRATION_MS, CoordinatorPartition, CoordinatorViews, TidState, TxnStatus
from txn_core.errors import (
    ConcurrentTransactionsError,
    InvalidTxnStateError,
    ProducerFencedError,
    StorageError,
    StoragePermissionError,
    TransactionTimedOutError,
)
from txn_core.format.entry import EntryKind, Payload
from txn_core.format.ids import TxnId, validate_name
from txn_core.format.states import CoordinatorState
from txn_core.logs import get_logger
from txn_core.partition.partition import PartitionLog
from txn_core.storage.base import Storage
from txn_core.storage.parallel import parallel_map

_C = CoordinatorState
#: the states of a transaction an abort decided
_ABORTED = (_C.PREPARE_ABORT, _C.COMPLETE_ABORT)
MAX_EPOCH = 2**31 - 16
#: How long a transaction may stay prepared before another participant completes it (ms).
MIN_COMPLETION_GRACE_MS = 5_000
MAX_TIMEOUT_MS = 15 * 60 * 1000
#: Rounds an operation re-reads a transactional id's state before giving up on a moving target.
MAX_ROUNDS = 64

logger = get_logger("txnlog.coordinator")


def coordinator_for(tid: str, partitions: int) -> int:
    """The coordinator partition of a transactional id: ``crc32(utf-8) % partitions``."""
    return zlib.crc32(tid.encode()) % partitions


def _completions(cur: TidState | None, completed: Sequence[TxnId]) -> list[Action]:
    """``complete`` actions for those of ``completed`` (decided transactions whose markers are durable,
    oldest first) that ``cur`` still has incomplete; someone else may have completed them meanwhile."""
    if cur is None:
        return []
    pending = set(cur.open_txns())
    return [Complete(cur.tid, t) for t in completed if t in pending]


def _grace_ms(st: TidState) -> int:
    return max(MIN_COMPLETION_GRACE_MS, st.timeout_ms)


class TransactionCoordinator:
    """Coordinator operations over one log's transaction log."""

    def __init__(
        self,
        storage: Storage,
        views: CoordinatorViews,
        logs: Callable[[str], PartitionLog],
        partitions: Callable[[], int],
        clock: Clock,
    ) -> None:
        self.storage = storage
        self.views = views
        self.logs = logs
        self._partitions = partitions
        self.clock = clock

    @property
    def partitions(self) -> int:
        """The log's coordinator partition count (from its format object, read when first needed)."""
        return self._partitions()

    def view_for(self, tid: str) -> CoordinatorPartition:
        return self.views.get(coordinator_for(tid, self.partitions))

    def state(self, tid: str, *, refresh: bool = True) -> TidState | None:
        view = self.view_for(tid)
        if refresh:
            view.refresh()
        return view.state(tid)

    def predict_txn(self, tid: str) -> TxnId | None:
        """The transaction id a ``begin`` of ``tid`` would get if created now: this process's view of its
        coordinator partition is current enough to append without reading and nothing is queued ahead of
        it. A guess for overlapping work with the begin (the create itself decides); None if unsure."""
        return self.view_for(tid).predict_next()

    # --- producer lifecycle -------------------------------------------------------------------

    def init_producer(self, tid: str, timeout_ms: int) -> TidState:
        """Fence older instances of ``tid`` and finish what they left (Kafka's InitProducerId).

        A completing transaction is completed; an ongoing one is aborted (its epoch bumped first, so its
        producer is fenced); a prepared one is completed. Then the epoch is bumped once more for the new
        instance. Raises :class:`ConcurrentTransactionsError` if the id's state kept changing for
        :data:`MAX_ROUNDS` rounds (another instance racing it).
        """
        validate_name("transactional id", tid)
        if not 1 <= timeout_ms <= MAX_TIMEOUT_MS:
            raise InvalidTxnStateError(f"transaction_timeout_ms must be in [1, {MAX_TIMEOUT_MS}], got {timeout_ms}")
        view = self.view_for(tid)

        def build(cur: TidState | None) -> list[Action] | None:
            if cur is not None and cur.open_txns():
                return None  # someone began or decided a transaction meanwhile: finish it first
            if cur is None or cur.epoch >= MAX_EPOCH:
                pid, epoch = allocate_producer_id(self.storage, clock=self.clock), 0
            else:
                pid, epoch = cur.producer_id, cur.epoch + 1
            return [Init(tid, pid, epoch, timeout_ms)]

        for _ in range(MAX_ROUNDS):
            view.refresh()
            current = view.state(tid)
            if current is not None and current.completing is not None:
                prepared = current.prepared(current.completing.txn)
                if prepared is not None:
                    self.complete(prepared)
                continue
            if current is not None and current.ahead is not None:
                current = current.activated()  # it may hold data: aborted like any open transaction
            if current is not None and current.state == _C.ONGOING:
                self._prepare_abort(view, current, reason="fenced by a new producer instance")
                continue
            if current is not None and current.state.is_prepared:
                self.complete(current)
                continue
            state = view.append(tid, build)
            if state is not None and state.state == _C.EMPTY and (current is None or state != current):
                logger.info(
                    "init %s: producer id %d epoch %d (older instances fenced)", tid, state.producer_id, state.epoch
                )
                return state
        raise ConcurrentTransactionsError(
            f"transactional id {tid!r}: its state kept changing while init_transactions() tried to fence older "
            f"instances ({MAX_ROUNDS} rounds): another instance keeps beginning transactions. Stop it, or retry."
        )

    def begin(
        self,
        tid: str,
        producer_id: int,
        epoch: int,
        timeout_ms: int,
        participants: Iterable[str],
        *,
        completed: Sequence[TxnId] = (),
    ) -> TidState:
        """Persist the start of a transaction with its first participants; returns the Ongoing state.

        ``epoch`` is the producer's epoch for the new transaction: the id's epoch after its last completed
        transaction, or that of a still-prepared previous transaction plus one (which then becomes the id's
        completing transaction). ``completed``: decided transactions of this producer whose markers are
        all durable, completed in the same record (one request instead of two)."""
        view = self.view_for(tid)
        begin = Begin(tid, producer_id, epoch, timeout_ms, tuple(participants))
        state = view.append(tid, lambda cur: [*_completions(cur, completed), begin])
        if state is None or state.txn is None or state.state != _C.ONGOING:  # pragma: no cover
            raise InvalidTxnStateError(f"transactional id {tid!r}: begin produced no transaction")
        return state

    def add(
        self,
        tid: str,
        producer_id: int,
        epoch: int,
        txn: TxnId,
        participants: Iterable[str],
        *,
        completed: Sequence[TxnId] = (),
    ) -> TidState:
        """Register participants before the first write to each (idempotent); ``completed`` as in
        :meth:`begin`."""
        view = self.view_for(tid)
        parts = tuple(participants)

        def build(cur: TidState | None) -> list[Action] | None:
            done = _completions(cur, completed)
            if (
                cur is not None
                and cur.txn == txn
                and cur.state == _C.ONGOING
                and cur.producer_id == producer_id
                and cur.epoch == epoch
                and all(p in cur.participants for p in parts)
            ):
                return done or None
            return [*done, Add(tid, producer_id, epoch, txn, parts)]

        state = view.append(tid, build)
        if state is None:  # pragma: no cover
            raise InvalidTxnStateError(f"transactional id {tid!r}: no state", transactional_id=tid)
        return state

    def end(
        self,
        tid: str,
        producer_id: int,
        epoch: int,
        txn: TxnId,
        commit: bool,
        metadata: dict[str, object] | None = None,
        *,
        complete: bool = True,
        completed: Sequence[TxnId] = (),
        started_ms: int | None = None,
        written: Sequence[str] | None = None,
        ahead: tuple[int, Sequence[str]] | None = None,
    ) -> TidState:
        """Decide and finish ``txn``: persist Prepare*, write markers, persist Complete*.

        A retried end of the same transaction with the same decision continues where the first stopped.
        With ``complete=False`` returns right after the decision is durable (markers not yet written).
        ``completed`` as in :meth:`begin`. The transaction's own producer also passes ``started_ms`` (its
        first write: the start of a transaction begun ahead, whose record has none) and ``written`` (the
        participants it wrote to: only they get markers).

        ``ahead`` (timeout, participants): also begin the producer's next transaction ahead in the same record
        (PROTOCOL.md "Begin ahead") with that timeout, running from its first write, and those participants
        (a guess: the producer passes those this one registered).
        Only where the record leaves nothing else completing (an older decided transaction not folded into
        ``completed`` keeps it out) and no other begin of a group commit takes the record; otherwise the
        decision is written alone. The returned state's ``ahead`` is then the next transaction.
        """
        view = self.view_for(tid)
        outcome: Outcome = "COMMIT" if commit else "ABORT"
        parts = None if written is None else tuple(written)

        def decide(cur: TidState | None) -> list[Action] | None:
            done = _completions(cur, completed)
            if cur is not None:
                cur = cur.seen_by(txn)  # this prepare may name the transaction begun ahead
            if cur is not None and cur.txn == txn and cur.state != _C.ONGOING:
                _check_repeated_end(cur, tid, producer_id, epoch, txn, commit)
                return done or None
            if commit and cur is not None and cur.txn == txn and cur.state == _C.ONGOING:
                deadline = cur.deadline_ms
                if deadline is None and started_ms is not None:
                    deadline = started_ms + cur.timeout_ms
                late = 0 if deadline is None else self.clock() - deadline
                if late > 0:  # past its timeout: aborted as any participant meeting it would abort it
                    timed_out.append(late)
                    return [*done, Prepare(tid, producer_id, epoch, txn, "ABORT", None, epoch + 1, "timeout", parts)]
            return [*done, Prepare(tid, producer_id, epoch, txn, outcome, metadata, None, None, parts)]

        def decide_and_begin(cur: TidState | None) -> list[Action] | None:
            actions = decide(cur)
            if not actions or ahead is None or cur is None or timed_out:
                return actions
            prepare = actions[-1]
            if not isinstance(prepare, Prepare) or prepare.txn != txn:
                return actions
            now = cur.activated()
            older = now.completing
            if older is not None and all(not (isinstance(a, Complete) and a.txn == older.txn) for a in actions):
                return actions  # an older transaction still completing: the id keeps at most one
            timeout_ms, guess = ahead
            return [*actions, Begin(tid, producer_id, epoch + 1, timeout_ms, tuple(guess), ahead=True)]

        timed_out: list[int] = []
        state = view.append(tid, decide_and_begin, fallback=decide) if ahead is not None else view.append(tid, decide)
        if state is None:  # pragma: no cover
            raise InvalidTxnStateError(f"transactional id {tid!r}: no state", transactional_id=tid)
        if timed_out and state.txn == txn and state.abort_reason == "timeout":
            self._timed_out_at_commit(state, timed_out[-1])
        logger.info("%s %s: transaction %s decided %s", outcome.lower(), tid, txn, state.state.name)
        if state.state.is_prepared and complete:
            state = self.complete(state)
        return state

    def withdraw(
        self, tid: str, producer_id: int, epoch: int, txn: TxnId, *, completed: Sequence[TxnId] = ()
    ) -> TidState:
        """Drop ``txn``, begun ahead and never written to (``withdraw``): no marker is due, nothing of it
        exists. Only its own producer may call this, knowing it wrote nothing under ``txn``; a closing
        producer does, folding ``completed`` into the same record."""
        view = self.view_for(tid)

        def build(cur: TidState | None) -> list[Action] | None:
            done = _completions(cur, completed)
            if cur is None or cur.ahead is None or cur.ahead.txn != txn:
                return done or None
            return [*done, Withdraw(tid, producer_id, epoch, txn)]

        state = view.append(tid, build)
        if state is None:  # pragma: no cover
            raise InvalidTxnStateError(f"transactional id {tid!r}: no state", transactional_id=tid)
        return state

    def _timed_out_at_commit(self, aborted: TidState, late_ms: int) -> None:
        """A commit asked for a transaction already past its timeout: ``end`` recorded its abort (with the
        bumped epoch and reason ``timeout``) instead, as a reader meeting it would have. Its markers and
        Complete are written here (left to whoever meets it after the grace if that fails: the abort is
        durable), and the producer hears it as :class:`TransactionTimedOutError`. Without this, a commit
        raced every reader's timeout check: it succeeded only if nobody looked in time."""
        try:
            self.complete(aborted)
        except StorageError as exc:
            logger.warning(
                "abort %s: markers of timed-out transaction %s left to readers: %s", aborted.tid, aborted.txn, exc
            )
        raise TransactionTimedOutError(
            f"transactional id {aborted.tid!r}: transaction {aborted.txn} exceeded its timeout of "
            f"{aborted.timeout_ms} ms (it was {late_ms} ms past its deadline when its commit was decided), so it "
            "was aborted "
            "instead of committed; nothing of it is visible. This producer is fenced: create a new one, call "
            "init_transactions() and redo the work; give transactions that need longer a larger "
            "transaction_timeout_ms.",
            transactional_id=aborted.tid,
            producer_id=aborted.producer_id,
            epoch=aborted.epoch - 1,
            current_producer_id=aborted.producer_id,
            current_epoch=aborted.epoch,
        )

    # --- second phase -------------------------------------------------------------------------

    def complete(self, prepared: TidState, *, markers_written: bool = False) -> TidState:
        """Write the markers of a decided transaction and persist its Complete* (idempotent).

        ``prepared`` is the transaction as its completer sees it (:meth:`TidState.prepared`): the id's
        current transaction or its completing one. A completing transaction of the same id that is older
        is completed first (its Complete must come first)."""
        txn = prepared.txn
        if txn is None:  # pragma: no cover
            raise InvalidTxnStateError(f"transactional id {prepared.tid!r}: nothing to complete")
        view = self.view_for(prepared.tid)
        written = markers_written
        blocked: list[TxnId] = []

        def build(cur: TidState | None) -> list[Action] | None:
            if cur is None or txn not in cur.open_txns():
                return None  # someone else completed it
            if cur.completing is not None and cur.completing.txn != txn:
                blocked.append(cur.completing.txn)
                return None  # an older completing transaction goes first
            return [Complete(prepared.tid, txn)]

        for _ in range(MAX_ROUNDS):
            current = view.state(prepared.tid)
            older = current.completing if current is not None else None
            if older is not None and older.txn != txn and current is not None:
                first = current.prepared(older.txn)
                if first is not None:
                    self.complete(first)
            if not written:
                self.write_markers(prepared)
                written = True
            blocked.clear()
            state = view.append(prepared.tid, build)
            if not blocked:
                if state is None:  # pragma: no cover
                    raise InvalidTxnStateError(f"transactional id {prepared.tid!r}: no state")
                return state
        raise ConcurrentTransactionsError(
            f"transactional id {prepared.tid!r}: transaction {txn} could not be completed: its state kept changing"
        )

    def write_markers(self, prepared: TidState, paths: Collection[str] | None = None) -> None:
        """One COMMIT or ABORT marker entry per participant log (or per log of ``paths``, some of them),
        written in parallel."""
        txn = prepared.txn
        if txn is None:  # pragma: no cover
            return
        kind = EntryKind.COMMIT if prepared.state in (_C.PREPARE_COMMIT, _C.COMPLETE_COMMIT) else EntryKind.ABORT
        payload = Payload.of_json({"outcome": kind.name, "txn": str(txn), "tid": prepared.tid})
        pid, epoch = prepared.producer_id, prepared.epoch
        parallel_map(
            lambda path: self.logs(path).append_payload(
                kind, payload, 1, producer_id=pid, producer_epoch=epoch, txn=txn
            ),
            list(prepared.participants) if paths is None else list(paths),
        )

    # --- timeouts, recovery, admin ------------------------------------------------------------

    def _prepare_abort(self, view: CoordinatorPartition, current: TidState, reason: str) -> TidState | None:
        """Abort ``current``'s Ongoing transaction (or its activated one begun ahead), fencing its producer,
        and complete it."""
        txn = current.txn

        def build(cur: TidState | None) -> list[Action] | None:
            if cur is not None:
                cur = cur.seen_by(txn)
            if cur is None or cur.txn != txn or cur.state != _C.ONGOING or txn is None:
                return None
            return [Prepare(cur.tid, cur.producer_id, cur.epoch, txn, "ABORT", None, cur.epoch + 1, reason)]

        state = view.append(current.tid, build)
        if state is not None and state.state.is_prepared and state.txn == txn:
            if state.state == _C.PREPARE_ABORT:
                logger.info(
                    "abort %s: transaction %s aborted (%s); epoch %d fenced", current.tid, txn, reason, current.epoch
                )
            return self.complete(state)  # aborted, or its producer's decision landed first: completed either way
        return state

    def abort_transaction(self, tid: str, reason: str = "aborted by an operator") -> TidState | None:
        """An operator's abort of ``tid``'s ongoing transaction (fences its producer), a transaction begun ahead
        included (whether its producer wrote under it only the data tells); completes a prepared or
        completing one."""
        view = self.view_for(tid)
        view.refresh()
        current = view.state(tid)
        if current is None:
            return None
        if current.completing is not None:
            prepared = current.prepared(current.completing.txn)
            if prepared is not None:
                self.complete(prepared)
            current = view.state(tid) or current
        if current.ahead is not None:
            current = current.activated()
        if current.state == _C.ONGOING:
            return self._prepare_abort(view, current, reason)
        if current.state.is_prepared:
            return self.complete(current)
        return current

    def expire(
        self,
        view: CoordinatorPartition,
        now: int | None = None,
        first_write: Callable[[TxnId, tuple[str, ...]], int | None] | None = None,
    ) -> list[TidState]:
        """Abort every transaction of ``view`` past its timeout; complete those prepared too long.

        ``first_write(txn, participants)``: when a transaction begun ahead first wrote to its guessed
        participants, as their readers see it (its timeout runs from there); asked only for one reserved for
        longer than its timeout. Without it, such a transaction is aborted only once unnamed for 7 days."""
        now = self.clock() if now is None else now
        done = []
        for st in view.open_states():
            deadline = st.deadline_ms
            written = False  # begun ahead, and its first write found: in use, whatever its reservation's age
            if (
                deadline is None
                and st.begun_ahead
                and first_write is not None
                and st.txn is not None
                and now - st.updated_ms > st.timeout_ms
            ):
                first = first_write(st.txn, st.participants)
                written = first is not None
                deadline = None if first is None else first + st.timeout_ms
            reason = None
            if st.state == _C.ONGOING and deadline is not None and now > deadline:
                reason = "timeout"
            elif st.begun_ahead and not written and now - st.updated_ms > TID_EXPIRATION_MS:
                # Begun ahead and named by no record for as long as an idle id takes to expire: its producer is
                # gone, or is fenced as Kafka's producer whose id mapping expired. Whether it wrote anything the
                # coordinator cannot know: aborted with markers, as any timeout.
                reason = "begun ahead and not used for 7 days"
            elif st.state.is_prepared and now - st.updated_ms > _grace_ms(st):
                done.append(self.complete(st))
            if reason is not None:
                result = self._prepare_abort(view, st, reason=reason)
                if result is not None and result.txn == st.txn and result.state in _ABORTED:
                    done.append(result)
        return done

    def resolve(self, txn: TxnId, first_write: Callable[[], int | None] | None = None) -> TxnStatus:
        """The status of ``txn`` for a reader, refreshing the coordinator view and enforcing its timeout.

        ``first_write``: when the reader's own log saw ``txn``'s first entry (its timestamp), asked only for a
        transaction begun ahead, whose timeout runs from its first write (PROTOCOL.md "Timeouts"): an entry
        is written after that first write, so the deadline a reader computes is never earlier than the
        producer's own. Without it, such a transaction is not timed out here."""
        view = self.views.get(txn.coordinator)
        status = view.status(txn)
        if status is None or status.state == _C.ONGOING or (status.state is not None and status.state.is_prepared):
            view.refresh()
            status = view.status(txn)
        if status is None:
            # The begin record is always durable before any data of the transaction; a transaction id
            # the coordinator never issued is not a transaction anyone will end: treat it as finished.
            return TxnStatus(txn, None)
        if status.state == _C.ONGOING and status.tid is not None and _past_deadline(status, self.clock(), first_write):
            st = view.state(status.tid)
            if st is not None:
                st = st.seen_by(txn)  # begun ahead and written under: aborted as any open transaction
            if st is not None and st.txn == txn and not self.storage.read_only:
                try:
                    self._prepare_abort(view, st, reason="timeout")
                except StoragePermissionError:  # a read-only reader cannot abort it: it waits for a writer
                    self.storage.read_only = True
            status = view.status(txn) or TxnStatus(txn, None)
        elif status.state is not None and status.state.is_prepared and status.tid is not None:
            prepared = view.prepared(txn)
            if (
                prepared is not None
                and not self.storage.read_only
                and self.clock() - prepared.updated_ms > _grace_ms(prepared)
            ):
                try:
                    self.complete(prepared)
                except StoragePermissionError:  # decided already: readers treat it as such anyway
                    self.storage.read_only = True
        return status


def _past_deadline(status: TxnStatus, now: int, first_write: Callable[[], int | None] | None) -> bool:
    """Whether an Ongoing ``status`` is past its timeout at ``now``: from its start, or, begun ahead, from the
    caller's first sight of its data (unknown: not past)."""
    start = status.start_ms
    if start is None:
        start = first_write() if first_write is not None else None
        if start is None:
            return False
    return now > start + status.timeout_ms


def _check_repeated_end(cur: TidState, tid: str, producer_id: int, epoch: int, txn: TxnId, commit: bool) -> None:
    """A repeated end request for an already decided ``txn``: fine if it asks for the same decision from the
    same producer; otherwise the error that says why it cannot."""
    decided_commit = cur.state in (_C.PREPARE_COMMIT, _C.COMPLETE_COMMIT)
    fenced = {"transactional_id": tid, "producer_id": producer_id, "epoch": epoch}
    if cur.abort_reason == "timeout" and (decided_commit != commit or cur.epoch not in (epoch, epoch + 1)):
        # a commit refused, or an abort by a producer the timeout fenced: either way it must start afresh
        raise TransactionTimedOutError(
            f"transactional id {tid!r}: transaction {txn} exceeded its timeout of {cur.timeout_ms} ms "
            "and was aborted (by a participant that met it, or by its own late commit); nothing of it is "
            "visible. This producer is "
            "fenced: create a new one and call init_transactions(), then redo the work.",
            current_producer_id=cur.producer_id,
            current_epoch=cur.epoch,
            **fenced,  # type: ignore[arg-type]
        )
    if decided_commit != commit and cur.abort_reason is not None and cur.epoch != epoch:
        raise ProducerFencedError(
            f"transactional id {tid!r}: transaction {txn} was aborted ({cur.abort_reason}); producer "
            f"id {producer_id} epoch {epoch} is fenced. Close this producer.",
            current_producer_id=cur.producer_id,
            current_epoch=cur.epoch,
            **fenced,  # type: ignore[arg-type]
        )
    if decided_commit != commit:
        raise InvalidTxnStateError(
            f"transactional id {tid!r}: transaction {txn} was already "
            f"{'committed' if decided_commit else 'aborted'}"
            + (f" ({cur.abort_reason})" if cur.abort_reason else "")
            + f"; it cannot be {'committed' if commit else 'aborted'}",
            transactional_id=tid,
            current=cur.state.value,
        )
    if cur.epoch not in (epoch, epoch + 1) or cur.producer_id != producer_id:
        raise ProducerFencedError(
            f"transactional id {tid!r}: producer id {producer_id} epoch {epoch} is fenced",
            current_producer_id=cur.producer_id,
            current_epoch=cur.epoch,
            **fenced,  # type: ignore[arg-type]
        )
